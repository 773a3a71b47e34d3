"""Live progress views on stderr, names never markup; off a terminal: docs/eval.md."""

from __future__ import annotations

import time

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from orchestrator.commands.output.base import err_console, plain
from orchestrator.commands.output.ticker import Pace, Ticker, first_estimate
from orchestrator.printable import printable
from remote.protocol.metrics import HEADLINE


class _Bars(Progress):
    """rich's `Progress` less its empty line before a never-started job's error line."""

    def stop(self) -> None:
        if self.tasks or self.disable:
            super().stop()
        else:
            self.live.stop()


def eval_bars(enabled: bool = True, label: str = "{task.description}") -> Progress:
    """An eval's bars: `label`, bar, done/total, a free ``info`` field, elapsed time."""
    return _Bars(
        TextColumn(label, style="bold", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=err_console,
        disable=not enabled,
        transient=False,
    )


class LiveProgress:
    """A job's events as bars, its outline, first estimate and warnings above them."""

    PHASES = {
        "await_ground_truth": "waiting for its ground truth",
        "ground_truth": "making or reading the ground truth",
        "eval": "loading the models",
    }

    def __init__(self, enabled: bool = True):
        self.progress = eval_bars(enabled)
        self.gt_task: TaskID | None = None
        self.eval_task: TaskID | None = None
        self.gt = Pace()
        self.eval = Pace()
        self.tau: float | None = None
        self.doing = "starting"
        self.estimated = False
        self.last: dict = {}
        self.ticker = Ticker(self.tick_line, enabled)

    def __enter__(self) -> LiveProgress:
        self.progress.__enter__()
        self.ticker.start()
        return self

    def __exit__(self, *exc) -> None:
        self.ticker.stop()
        self.progress.__exit__(*exc)

    def say(self, text: str) -> None:
        self.progress.console.print(plain(text), soft_wrap=True)

    def tick_line(self) -> str | None:
        """What the job is doing now (`Ticker`); nothing before its first event, so a job
        failing its host checks ends in its one error line alone."""
        if not self.last:
            return None
        if self.eval.done:
            line = f"eval: {self.eval.count('samples')}"
            extra = [self.eval.rate(), f"tau {self.tau:.3f}" if self.tau else ""]
            if self.eval.done == self.eval.total:
                extra.append("timing one round's costs, then the results")
            else:
                extra.append(self.eval.eta())
            return ", ".join([line, *[e for e in extra if e]])
        if self.gt.total and self.doing == self.PHASES["ground_truth"]:
            return ", ".join(x for x in (f"ground truth: {self.gt.count('')}", self.gt.eta()) if x)
        return f"eval: {self.doing}"

    def __call__(self, ev: dict) -> None:
        kind = ev.get("event")
        self.last = ev
        if kind == "warning":
            self.progress.console.print(
                f"[bold yellow]warning:[/] {plain(ev.get('message'))}", soft_wrap=True
            )
        elif kind in ("outline", "note"):
            self.say(str(ev.get("text") or ev.get("message")))
        elif kind == "phase" and ev.get("phase") in self.PHASES:
            self.doing = self.PHASES[ev["phase"]]
        if kind == "phase" and ev.get("phase") == "ground_truth" and self.gt_task is None:
            self.gt_task = self.progress.add_task(
                f"ground truth ({printable(str(ev.get('source')))})", total=None, info=""
            )
        elif kind == "ground_truth":
            if self.gt_task is None:
                self.gt_task = self.progress.add_task("ground truth", total=None, info="")
            self.gt.update(ev.get("time"), ev.get("done") or 0, ev.get("total"))
            self.progress.update(
                self.gt_task,
                completed=ev.get("done", 0),
                total=ev.get("total"),
                info="cached on host" if ev.get("cached") else self.gt.eta(),
            )
        elif kind in ("start", "sample"):
            total = ev.get("total") or ev.get("samples")
            if self.eval_task is None:
                self.eval.update(ev.get("time"), 0, total)
                self.eval_task = self.progress.add_task("eval", total=total, info="")
                self.doing = "loading the models"
            if kind == "sample":
                self._sample(ev, total)
            elif total:
                self.progress.update(self.eval_task, total=total)
        elif kind == "done" and self.eval_task is not None:
            task = self.progress.tasks[self.eval_task]
            if task.total:
                self.progress.update(self.eval_task, completed=task.total)

    def _sample(self, ev: dict, total: int | None) -> None:
        # the job's own timestamps: right when an attach replays old events
        self.eval.update(ev.get("time"), ev.get("done") or 0, total, int(ev.get("tokens") or 0))
        tau = ev.get(HEADLINE)
        self.tau = tau if isinstance(tau, (int, float)) else self.tau
        info = "  ".join(
            x
            for x in (self.eval.rate(), f"tau {tau:.3f}" if self.tau else "", self.eval.eta())
            if x
        )
        self.progress.update(self.eval_task, completed=ev.get("done", 0), total=total, info=info)
        estimate = None if self.estimated else first_estimate(self.eval)
        if estimate:
            self.estimated = True
            self.say(estimate)


class ShardProgress:
    """A sharded eval's view: ground truth, a row per host, a total; called as ``view(host,
    event)`` from several watcher threads (the library serialises the calls)."""

    def __init__(self, enabled: bool = True):
        self.progress = eval_bars(enabled, label="{task.description:>14}")
        self.gt_task: TaskID | None = None
        self.total_task: TaskID | None = None
        self.rows: dict[str, TaskID] = {}
        self.hosts: dict[str, dict] = {}  # host -> {total, done, tokens, started, tau, failed}
        self.planned = False
        self.pace = Pace()  # the whole run's, for the total row
        self.estimated = False
        self.noted: set = set()
        self.ticker = Ticker(self.tick_line, enabled)

    def __enter__(self) -> ShardProgress:
        self.progress.__enter__()
        self.ticker.start()
        return self

    def __exit__(self, *exc) -> None:
        self.ticker.stop()
        self.progress.__exit__(*exc)

    def tick_line(self) -> str | None:
        """The run's samples, rate and time left, and each host's count (`Ticker`)."""
        if not self.hosts:  # the ground truth is made first
            if self.gt_task is None:
                return None
            gt = self.progress.tasks[self.gt_task]
            return f"ground truth: {gt.completed:.0f}/{gt.total or '?'}"
        rows = ", ".join(f"{host} {h['done']}/{h['total']}" for host, h in self.hosts.items())
        head = [f"eval: {self.pace.count('samples')}", self.pace.rate(), self.pace.eta()]
        return ", ".join(x for x in head if x) + f" ({rows})"

    def _row(self, host: str) -> tuple[TaskID, dict]:
        if host not in self.rows:
            self.rows[host] = self.progress.add_task(printable(host), total=0, info="")
            self.hosts[host] = {
                "total": 0,
                "done": 0,
                "tokens": 0,
                "started": None,
                "last": None,
                "tau": None,
                "failed": 0,
            }
        return self.rows[host], self.hosts[host]

    def _total(self) -> None:
        done = sum(h["done"] for h in self.hosts.values())
        tokens = sum(h["tokens"] for h in self.hosts.values())
        starts = [h["started"] for h in self.hosts.values() if h["started"]]
        lasts = [h["last"] for h in self.hosts.values() if h["last"]]
        info = ""
        if starts and lasts:
            info = f"{tokens / max(1e-3, max(lasts) - min(starts)):,.0f} tok/s"
        if self.total_task is None:
            self.total_task = self.progress.add_task("total", total=None, info="")
        total = self.progress.tasks[self.total_task].total
        if lasts:
            self.pace.started, self.pace.last = min(starts or lasts), max(lasts)
            self.pace.done, self.pace.total, self.pace.tokens = done, total, tokens
            info += f"  {self.pace.eta()}" if self.pace.eta() else ""
        self.progress.update(self.total_task, completed=done, info=info)
        estimate = None if self.estimated else first_estimate(self.pace)
        if estimate:
            self.estimated = True
            self.progress.console.print(plain(estimate), soft_wrap=True)

    def set_total(self, n: int) -> None:
        self._total()
        self.progress.update(self.total_task, total=n)

    def __call__(self, host: str, ev: dict) -> None:
        kind = ev.get("event")
        if kind == "warning":
            self.progress.console.print(
                f"[bold yellow]warning ({plain(host)}):[/] {plain(ev.get('message'))}",
                soft_wrap=True,
            )
        elif kind == "outline" or (kind == "note" and ev.get("message") not in self.noted):
            self.noted.add(ev.get("message"))  # every host's job says the same: once
            text = ev.get("text") or f"{host}: {ev.get('message')}"
            self.progress.console.print(plain(str(text)), soft_wrap=True)
        elif kind == "plan":
            self.planned = True
            self.set_total(int(ev.get("samples") or 0))
        elif kind == "ground_truth" and not self.planned:  # shard jobs' slices: not news
            if self.gt_task is None:
                self.gt_task = self.progress.add_task("ground truth", total=None, info="")
            self.progress.update(
                self.gt_task,
                completed=ev.get("done", 0),
                total=ev.get("total"),
                info=plain(f"{host}, cached" if ev.get("cached") else host),
            )
        elif kind == "shard":
            task, h = self._row(host)
            h["total"] += int(ev.get("samples") or 0)
            self.progress.update(task, total=h["total"])
        elif kind == "start" and host in self.hosts:
            h = self.hosts[host]
            h["started"] = h["started"] or ev.get("time") or time.time()
        elif kind == "sample":
            task, h = self._row(host)
            h["done"] += 1
            h["tokens"] += int(ev.get("tokens") or 0)
            h["last"] = ev.get("time") or time.time()
            h["started"] = h["started"] or h["last"]
            if isinstance(ev.get(HEADLINE), (int, float)):
                h["tau"] = ev[HEADLINE]
            self._render(task, h)
            self._total()
        elif kind == "shard_failed":
            task, h = self._row(host)
            h["failed"] += 1
            h["total"] -= int(ev.get("unfinished") or 0)  # they move to other hosts' rows
            self.progress.update(task, total=h["total"])
            self._render(task, h)
            self.progress.console.print(
                f"[bold red]{plain(host)} failed:[/] {plain(ev.get('error'))}; "
                f"{plain(ev.get('kept'))} sample(s) kept, {plain(ev.get('unfinished'))} re-run "
                "on other hosts",
                soft_wrap=True,
            )

    def _render(self, task: TaskID, h: dict) -> None:
        info = ""
        if h["started"] and h["last"]:
            info = f"{h['tokens'] / max(1e-3, h['last'] - h['started']):,.0f} tok/s"
        if h["tau"] is not None:
            info += f"  tau {h['tau']:.3f}"
        if h["failed"]:
            info += "  [red]failed[/]"
        self.progress.update(task, completed=h["done"], total=h["total"], info=info)


def job_started(host: str):
    """A watched eval's ``on_start``: the job id on stderr at once, known if dflash dies."""

    def started(ref) -> None:
        pushed = " (bundle pushed)" if ref.bundle_pushed else ""
        err_console.print(plain(f"started job {ref.job_id} on {host}{pushed}"), soft_wrap=True)
        err_console.file.flush()

    return started


class ParityLines:
    """Parity's view: a line per started job, a bar per stage, the warnings."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.progress = eval_bars(enabled)
        self.tasks: dict[str, TaskID] = {}
        self.ticker = Ticker(self.tick_line, enabled)

    def __enter__(self) -> ParityLines:
        self.progress.__enter__()
        self.ticker.start()
        return self

    def __exit__(self, *exc) -> None:
        self.ticker.stop()
        self.progress.__exit__(*exc)

    def tick_line(self) -> str | None:
        """Each stage's samples so far (`Ticker`)."""
        tasks = [self.progress.tasks[t] for t in self.tasks.values()]
        shown = [f"{t.description} {t.completed:.0f}/{t.total or '?'}" for t in tasks]
        return ("parity: " + ", ".join(shown)) if shown else None

    def started(self, stage: str, ref) -> None:
        if self.enabled:
            self.progress.console.print(
                plain(f"{stage}: job {ref.job_id} on {ref.host}"), soft_wrap=True
            )

    def __call__(self, stage: str, ev: dict) -> None:
        if not self.enabled:
            return
        if ev.get("event") == "sample":
            if stage not in self.tasks:
                self.tasks[stage] = self.progress.add_task(printable(stage), total=None, info="")
            self.progress.update(
                self.tasks[stage], completed=ev.get("done") or 0, total=ev.get("total")
            )
        elif ev.get("event") == "warning":
            self.progress.console.print(
                f"[yellow]warning ({plain(stage)}):[/] {plain(ev.get('message'))}",
                soft_wrap=True,
            )
