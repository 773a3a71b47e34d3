"""Everything the CLI shows, in one place: the consoles, JSON for scripts, tables and the
live progress views the commands hand to the library (relay bytes, eval samples, shards,
follow's lines). Commands render through this module and never import one another."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from orchestrator.eval import follow as follow_lib
from orchestrator.relay import run as relay_lib
from orchestrator.results import parity_view
from orchestrator.results import store as res

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def print_json(obj: Any) -> None:
    """JSON on stdout, nothing else, so scripts can pipe it."""
    typer.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))


# ---- tables -------------------------------------------------------------------------------


def compact(title: str | None = None, **kw: Any) -> Table:
    """A table that spends its width on data, not borders (fits 100 columns)."""
    return Table(
        title=title,
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
        show_edge=False,
        **kw,
    )


def fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def render_summary(run: res.Run) -> None:
    """The headline table of one run (also printed at the end of `remote-eval`)."""
    s = res.summary(run)
    table = Table(title=f"{s['checkpoint']}  ({s['run_id']})", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", overflow="fold")  # a sha256 wraps, never cut
    table.add_row("tau (z-lab: mean of per-sample means)", fmt(s["tau"]))
    table.add_row("tau (token-weighted: tokens / rounds)", fmt(s["tau_tokens"]))
    for b, v in s["ddtree"].items():
        table.add_row(f"DDTree-{b} tau", fmt(v))
    table.add_row("target agreement", pct(s["target_agreement"]))
    table.add_row(
        "training run",
        f"{run.training_run.name} ({run.training_run.host}:{run.training_run.folder})",
    )
    table.add_row("step", fmt(s["step"]))
    table.add_row("drafter sha256", fmt(s["drafter_sha256"]))
    table.add_row("evaluated", s["created_time"])
    table.add_row(
        "samples / tokens / rounds",
        f"{fmt(s['samples'])} / {fmt(s['tokens'])} / {fmt(s['rounds'])}",
    )
    gt = res.ground_truth_source(run)
    src = gt.get("kind") or "-"
    if gt.get("url"):
        src += f" {gt['url']}"
    if gt.get("cached"):
        src += " (cached on host)"
    table.add_row("ground truth", src)
    if s["retokenisation_mismatch"] is not None:
        table.add_row("retokenisation mismatch", f"[yellow]{pct(s['retokenisation_mismatch'])}[/]")
    console.print(table)
    for w in gt.get("warnings") or []:
        console.print(f"[bold yellow]warning:[/] {w}", soft_wrap=True)


# ---- live progress ------------------------------------------------------------------------


class RelayProgress(relay_lib.Progress):
    """A rich bar: bytes, rate, time left, files done (on stderr, stdout stays for --json)."""

    def __init__(self) -> None:
        self.bar = Progress(
            TextColumn("[bold]relay"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[files]}"),
            console=err_console,
            transient=False,
        )
        self.task = None
        self.files = 0
        self.total_files = 0
        self.lock = threading.Lock()

    def start(self, total_bytes: int, total_files: int) -> None:
        if total_files == 0:
            return
        self.total_files = total_files
        self.bar.start()
        self.task = self.bar.add_task("relay", total=total_bytes, files=f"0/{total_files} files")

    def advance(self, nbytes: int) -> None:
        if self.task is not None:
            self.bar.update(self.task, advance=nbytes)

    def file_done(self, checkpoint: str, path: str) -> None:
        with self.lock:
            self.files += 1
        if self.task is not None:
            self.bar.update(self.task, files=f"{self.files}/{self.total_files} files")

    def message(self, text: str) -> None:
        self.bar.console.print(f"[yellow]{text}[/]")

    def stop(self) -> None:
        if self.task is not None:
            self.bar.stop()


class LiveProgress:
    """Turns job events into rich progress bars: ground truth, then the eval with samples,
    tokens/s and the running tau. Warnings are printed above the bars as they come."""

    def __init__(self, enabled: bool = True):
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=err_console,
            disable=not enabled,
            transient=False,
        )
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
                f"[bold yellow]warning:[/] {ev.get('message')}", soft_wrap=True
            )
        elif kind == "phase" and ev.get("phase") == "ground_truth" and self.gt_task is None:
            self.gt_task = self.progress.add_task(
                f"ground truth ({ev.get('source')})", total=None, info=""
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
                tau = ev.get("tau")
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
        self.progress = Progress(
            TextColumn("[bold]{task.description:>14}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=err_console,
            disable=not enabled,
            transient=False,
        )
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
            self.rows[host] = self.progress.add_task(host, total=0, info="")
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
                f"[bold yellow]warning ({host}):[/] {ev.get('message')}", soft_wrap=True
            )
        elif kind == "plan":
            self.planned = True
            self.set_total(int(ev.get("samples") or 0))
        elif kind == "ground_truth" and not self.planned:  # shard jobs' slices: not news
            if self.gt_task is None:
                self.gt_task = self.progress.add_task("ground truth", total=None, info=host)
            self.progress.update(
                self.gt_task,
                completed=ev.get("done", 0),
                total=ev.get("total"),
                info=f"{host}, cached" if ev.get("cached") else host,
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
            if isinstance(ev.get("tau"), (int, float)):
                h["tau"] = ev["tau"]
            self._render(task, h)
            self._total()
        elif kind == "shard_failed":
            task, h = self._row(host)
            h["failed"] += 1
            h["total"] -= int(ev.get("unfinished") or 0)  # they move to other hosts' rows
            self.progress.update(task, total=h["total"])
            self._render(task, h)
            self.progress.console.print(
                f"[bold red]{host} failed:[/] {ev.get('error')}; {ev.get('kept')} sample(s) "
                f"kept, {ev.get('unfinished')} re-run on other hosts",
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


class RichEvents(follow_lib.FollowEvents):
    """Timestamped lines, the relay's byte bar and the eval's live bar, on stderr."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.relay_bar: RelayProgress | None = None
        self.live: LiveProgress | None = None
        self.live_for: str | None = None

    def _close(self) -> None:
        if self.relay_bar is not None:
            self.relay_bar.stop()
            self.relay_bar = None
        if self.live is not None:
            self.live.__exit__(None, None, None)
            self.live = None

    def message(self, text: str) -> None:
        self._close()
        if self.enabled:
            err_console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {text}", soft_wrap=True)

    def relay_progress(self, checkpoint: str):
        self._close()
        if not self.enabled:
            return None
        self.relay_bar = RelayProgress()
        return self.relay_bar

    def eval_event(self, checkpoint: str, event: dict) -> None:
        if not self.enabled:
            return
        if self.live is None or self.live_for != checkpoint:
            self._close()
            self.live, self.live_for = LiveProgress(True).__enter__(), checkpoint
        self.live(event)

    def recorded(self, entry: dict) -> None:
        self._close()
        if not self.enabled:
            return
        if entry["state"] != "done":
            err_console.print(
                f"[red]{entry['checkpoint']}: failed[/]: {entry.get('error')}", soft_wrap=True
            )
            return
        trees = ", ".join(
            f"DDTree-{b} {v:.3f}" for b, v in entry["ddtree"].items() if v is not None
        )
        err_console.print(
            f"[bold green]{entry['checkpoint']}[/] (step {entry['step']}): "
            f"tau {_f(entry['tau'])} (token-weighted {_f(entry['tau_tokens'])})"
            + (f", {trees}" if trees else ""),
            soft_wrap=True,
        )

    def close(self) -> None:
        self._close()


def _f(v) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) else "-"


def history_table(history: list[dict], title: str = "tau per checkpoint step") -> Table:
    """Step, checkpoint, tau (z-lab per-sample mean and token-weighted), DDTree tau per node
    budget and the target agreement rate; run ids are in the history JSON."""
    budgets = sorted({b for h in history for b in (h.get("ddtree") or {})}, key=int)
    table = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
        show_edge=False,
    )  # fits 80 columns
    for col in ("step", "checkpoint", "tau", "tau tok", *[f"DDTree-{b}" for b in budgets], "agree"):
        table.add_column(col, justify="left" if col == "checkpoint" else "right", no_wrap=True)
    for h in sorted(history, key=lambda h: (h.get("step") is None, h.get("step") or 0)):
        if h.get("state") != "done":
            table.add_row(
                str(h.get("step")),
                h["checkpoint"],
                f"[red]failed[/]: {(h.get('error') or '')[:60]}",
                "",
                *[""] * len(budgets),
                "",
            )
            continue
        table.add_row(
            str(h.get("step")),
            h["checkpoint"],
            _f(h.get("tau")),
            _f(h.get("tau_tokens")),
            *[_f((h.get("ddtree") or {}).get(b)) for b in budgets],
            _f(h.get("target_agreement")),
        )
    return table


def render_parity(result: dict, run_dir: Path) -> None:
    """The parity table: sides, per-layer errors, top-1 agreement, tau A/B."""
    console.print(f"A: {parity_view.side_label(result, 'a')}")
    console.print(f"B: {parity_view.side_label(result, 'b')}")
    for side in ("a", "b"):
        k = ((result.get("captures") or {}).get(side) or {}).get("kernels") or {}
        console.print(
            f"  kernels on {side.upper()}: "
            + ", ".join(f"{n} {v.get('version') or 'absent'}" for n, v in k.items())
        )
    tokens = (result.get("layers") or [{}])[0].get("tokens", "?")
    t = Table(
        title=f"features per layer ({result.get('samples')} samples, {tokens} tokens; "
        "A = reference)"
    )
    for col in parity_view.LAYER_COLUMNS:
        t.add_column(col, justify="right")
    for row in parity_view.layer_rows(result):
        t.add_row(*row)
    console.print(t)
    top1 = result.get("top1_agreement") or {}
    rate = top1.get("rate")
    console.print(
        f"top-1 agreement of the logits: {top1.get('match')}/{top1.get('total')}"
        + (f" ({rate:.2%})" if rate is not None else "")
    )
    d = result.get("drafter")
    if d:
        console.print(
            f"drafter {d['path']} (layers {d['target_layer_ids']}):  tau A "
            f"{d['tau_a']:.4f}  tau B {d['tau_b']:.4f}  delta tau (B - A) "
            f"{d['delta_tau']:+.4f}  samples diverging {d['samples_diverging']}/"
            f"{len(d['per_sample'])}"
        )
    if result.get("identical"):
        console.print("[green]identical: the hosts compute the same features bit for bit[/]")
    pngs = sorted(p.name for p in run_dir.glob("*.png"))
    console.print(f"results: {run_dir}" + (f"  plot: {', '.join(pngs)}" if pngs else ""))
