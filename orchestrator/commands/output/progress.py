"""The live progress views the commands hand to the library: the eval's sample bars (one
job, or one row per host of a sharded eval) and parity's stages (follow's lines:
`events`; the relay's byte bar: `relaybar`). All on stderr, so stdout stays for ``--json``.

One rule for all of them: every live view is a rich `Progress` (`eval_bars`, or the
relay's bytes), which redraws itself in place on a terminal and, off one (a pipe, a log
file, CI), prints nothing while it runs and its final rows once, as whole lines, when it
stops. Nothing here writes a carriage return of its own, so a log never gets one endless
line. Names in descriptions and messages are text, never markup."""

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
from orchestrator.printable import printable
from remote.protocol.metrics import HEADLINE


class _Bars(Progress):
    """rich's `Progress`, less the empty line it prints when it stops off a terminal with
    no row drawn (it came before the error line of a job that never started)."""

    def stop(self) -> None:
        if self.tasks or self.disable:
            super().stop()
        else:
            self.live.stop()


def eval_bars(enabled: bool = True, label: str = "{task.description}") -> Progress:
    """The bars of an eval: a label, the bar, done/total, a free ``info`` field (rate, tau)
    and the elapsed time, on stderr. `label` formats the description (a sharded eval
    right-aligns its host names)."""
    return _Bars(
        TextColumn(label, style="bold", markup=False),  # host and stage names: never markup
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=err_console,
        disable=not enabled,
        transient=False,
    )


class LiveProgress:
    """Turns job events into rich progress bars: ground truth, then the eval with samples,
    tokens/s and the running tau. Warnings are printed above the bars as they come."""

    def __init__(self, enabled: bool = True):
        self.progress = eval_bars(enabled)
        self.gt_task: TaskID | None = None
        self.eval_task: TaskID | None = None
        self.tokens = 0
        self.eval_started: float | None = None  # the job's clock (event times), not ours
        self.last: dict = {}

    def __enter__(self) -> LiveProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def __call__(self, ev: dict) -> None:
        kind = ev.get("event")
        self.last = ev
        if kind == "warning":
            self.progress.console.print(
                f"[bold yellow]warning:[/] {plain(ev.get('message'))}", soft_wrap=True
            )
        elif kind == "phase" and ev.get("phase") == "ground_truth" and self.gt_task is None:
            self.gt_task = self.progress.add_task(
                f"ground truth ({printable(str(ev.get('source')))})", total=None, info=""
            )
        elif kind == "ground_truth":
            if self.gt_task is None:
                self.gt_task = self.progress.add_task("ground truth", total=None, info="")
            self.progress.update(
                self.gt_task,
                completed=ev.get("done", 0),
                total=ev.get("total"),
                info="cached on host" if ev.get("cached") else "",
            )
        elif kind in ("start", "sample"):
            total = ev.get("total") or ev.get("samples")
            if self.eval_task is None:
                self.eval_started = ev.get("time") or time.time()
                self.eval_task = self.progress.add_task("eval", total=total, info="")
            if kind == "sample":
                self.tokens += int(ev.get("tokens") or 0)
                # Rates from the job's own timestamps: right even when --attach replays
                # events that happened while nobody was watching.
                now = ev.get("time") or time.time()
                elapsed = max(1e-3, now - (self.eval_started or now))
                tau = ev.get(HEADLINE)  # the running headline metric
                info = f"{self.tokens / elapsed:,.0f} tok/s"
                if isinstance(tau, (int, float)):
                    info += f"  tau {tau:.3f}"
                self.progress.update(
                    self.eval_task, completed=ev.get("done", 0), total=total, info=info
                )
            elif total:
                self.progress.update(self.eval_task, total=total)
        elif kind == "done" and self.eval_task is not None:
            task = self.progress.tasks[self.eval_task]
            if task.total:
                self.progress.update(self.eval_task, completed=task.total)


class ShardProgress:
    """One progress view for a sharded eval: the ground-truth row (first host), a row per
    host (samples, tokens/s from that host's own event times, running tau, failures) and a
    total row. Called as ``view(host, event)`` from several watcher threads (the library
    serialises the calls)."""

    def __init__(self, enabled: bool = True):
        self.progress = eval_bars(enabled, label="{task.description:>14}")
        self.gt_task: TaskID | None = None
        self.total_task: TaskID | None = None
        self.rows: dict[str, TaskID] = {}
        self.hosts: dict[str, dict] = {}  # host -> {total, done, tokens, started, tau, failed}
        self.planned = False

    def __enter__(self) -> ShardProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

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
        self.progress.update(self.total_task, completed=done, info=info)

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
    """The ``on_start`` of a watched eval: the job id at once (flushed, on stderr, with or
    without ``--json``), so it is known even if dflash dies later."""

    def started(ref) -> None:
        pushed = " (bundle pushed)" if ref.bundle_pushed else ""
        err_console.print(plain(f"started job {ref.job_id} on {host}{pushed}"), soft_wrap=True)
        err_console.file.flush()

    return started


class ParityLines:
    """Parity's stage view: a line per started job, a bar per stage (its samples) and the
    warnings, like the eval's (see the module docstring for what it does off a terminal)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.progress = eval_bars(enabled)
        self.tasks: dict[str, TaskID] = {}

    def __enter__(self) -> ParityLines:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

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
