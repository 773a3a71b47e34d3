"""`dflash remote-eval` (start, --attach, --cancel) and `dflash jobs`."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn,
                           TimeElapsedColumn)
from rich.table import Table

from orchestrator import remote_eval, shard
from orchestrator.commands.common import (DtypeOption, InventoryOption, JsonOption, console,
                                          err_console, inventory, print_json)
from orchestrator.errors import DflashError
from orchestrator.hosts import open_host


class LiveProgress:
    """Turns job events into rich progress bars: ground truth, then the eval with samples,
    tokens/s and the running tau. Warnings are printed above the bars as they come."""

    def __init__(self, enabled: bool = True):
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                                 TimeElapsedColumn(), console=err_console,
                                 disable=not enabled, transient=False)
        self.gt_task: TaskID | None = None
        self.eval_task: TaskID | None = None
        self.tokens = 0
        self.eval_started: float | None = None  # the job's clock (event times), not ours
        self.last: dict = {}

    def __enter__(self) -> "LiveProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def __call__(self, ev: dict) -> None:
        kind = ev.get("event")
        self.last = ev
        if kind == "warning":
            self.progress.console.print(f"[bold yellow]warning:[/] {ev.get('message')}",
                                        soft_wrap=True)
        elif kind == "phase" and ev.get("phase") == "ground_truth" and self.gt_task is None:
            self.gt_task = self.progress.add_task(
                f"ground truth ({ev.get('source')})", total=None, info="")
        elif kind == "ground_truth":
            if self.gt_task is None:
                self.gt_task = self.progress.add_task("ground truth", total=None, info="")
            self.progress.update(self.gt_task, completed=ev.get("done", 0),
                                 total=ev.get("total"),
                                 info="cached on host" if ev.get("cached") else "")
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
                self.progress.update(self.eval_task, completed=ev.get("done", 0), total=total,
                                     info=info)
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
        self.progress = Progress(TextColumn("[bold]{task.description:>14}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                                 TimeElapsedColumn(), console=err_console,
                                 disable=not enabled, transient=False)
        self.gt_task: TaskID | None = None
        self.total_task: TaskID | None = None
        self.rows: dict[str, TaskID] = {}
        self.hosts: dict[str, dict] = {}  # host -> {total, done, tokens, started, tau, failed}
        self.planned = False

    def __enter__(self) -> "ShardProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def _row(self, host: str) -> tuple[TaskID, dict]:
        if host not in self.rows:
            self.rows[host] = self.progress.add_task(host, total=0, info="")
            self.hosts[host] = {"total": 0, "done": 0, "tokens": 0, "started": None,
                                "last": None, "tau": None, "failed": 0}
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
            self.progress.console.print(f"[bold yellow]warning ({host}):[/] "
                                        f"{ev.get('message')}", soft_wrap=True)
        elif kind == "plan":
            self.planned = True
            self.set_total(int(ev.get("samples") or 0))
        elif kind == "ground_truth" and not self.planned:  # shard jobs' slices: not news
            if self.gt_task is None:
                self.gt_task = self.progress.add_task("ground truth", total=None, info=host)
            self.progress.update(self.gt_task, completed=ev.get("done", 0),
                                 total=ev.get("total"),
                                 info=f"{host}, cached" if ev.get("cached") else host)
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
                f"kept, {ev.get('unfinished')} re-run on other hosts", soft_wrap=True)

    def _render(self, task: TaskID, h: dict) -> None:
        info = ""
        if h["started"] and h["last"]:
            info = f"{h['tokens'] / max(1e-3, h['last'] - h['started']):,.0f} tok/s"
        if h["tau"] is not None:
            info += f"  tau {h['tau']:.3f}"
        if h["failed"]:
            info += "  [red]failed[/]"
        self.progress.update(task, completed=h["done"], total=h["total"], info=info)


def _budgets(text: Optional[str]) -> list[int]:
    if not text:
        return [8, 16, 32, 64]
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DflashError(f"--budgets expects comma-separated integers, got {text!r}")
    return out  # EvalOptions refuses budgets below 1


def remote_eval_cmd(
    checkpoint: Annotated[Optional[str], typer.Option(
        "--checkpoint", "-c", help="Drafter checkpoint: a name under the eval host's "
        "'drafters' folder, or an absolute path there.")] = None,
    host: Annotated[Optional[str], typer.Option(
        "--host", "-H", help="Eval host (default: defaults.eval_host).")] = None,
    hosts: Annotated[Optional[str], typer.Option(
        "--hosts", help="Shard the samples across these eval hosts (comma-separated names "
        "or inventory groups) and merge into one result.")] = None,
    attach: Annotated[Optional[str], typer.Option(
        "--attach", help="Resume watching job JOB, then pull its results.",
        metavar="JOB")] = None,
    cancel: Annotated[Optional[str], typer.Option(
        "--cancel", help="Stop job JOB and every process it started.", metavar="JOB")] = None,
    detach: Annotated[bool, typer.Option(
        "--detach", help="Start the job and return; watch later with --attach.")] = False,
    prompts: Annotated[Optional[str], typer.Option(
        help="Built-in set (math, code, chat), a local JSONL file, or host:/path.")] = None,
    samples: Annotated[Optional[int], typer.Option(
        min=1, help="Evaluate this many prompts (seeded choice).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the prompt choice.")] = 0,
    max_new_tokens: Annotated[Optional[int], typer.Option(
        min=1, help="Ground-truth completion length (default: the inventory's, else 256).")
    ] = None,
    thinking: Annotated[bool, typer.Option(
        "--thinking/--no-thinking", help="Chat template with thinking on or off "
        "(enable_thinking).")] = False,
    temperature: Annotated[float, typer.Option(
        help="Must be 0: only greedy ground truth is accepted.")] = 0.0,
    ground_truth: Annotated[Optional[str], typer.Option(
        help="Ground-truth server URL (as seen from the eval host), or a file there for "
        "kind 'file' (default: the inventory's).")] = None,
    ground_truth_kind: Annotated[Optional[str], typer.Option(
        help="sglang | openai | openai-text | file | local.")] = None,
    ground_truth_model: Annotated[Optional[str], typer.Option(
        help="Model name for OpenAI-compatible servers (default: the first served).")] = None,
    target: Annotated[Optional[str], typer.Option(
        help="Target model folder on the host (default: the inventory's).")] = None,
    dtype: DtypeOption = None,
    threads: Annotated[Optional[int], typer.Option(
        min=1, help="CPU threads on the host.")] = None,
    budgets: Annotated[Optional[str], typer.Option(
        help="DDTree node budgets, comma-separated (default 8,16,32,64).")] = None,
    topk: Annotated[Optional[int], typer.Option(
        min=1, help="DDTree per-depth candidates (default: the budget).")] = None,
    positions: Annotated[Optional[str], typer.Option(
        help="Draft at 'all' completion positions (default; exact per-position acceptance) "
        "or only at the 'walk' positions (tau times fewer blocks, one at a time: pays for "
        "drafters with several layers).")] = None,
    device: Annotated[Optional[str], typer.Option(
        help="Where the engine computes on the host: cpu (default), cuda or cuda:N.")] = None,
    results: Annotated[Optional[str], typer.Option(
        "--results-dir", help="Local results folder (default: defaults.results_dir).")] = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Evaluate a drafter checkpoint ON the eval host, detached; watch it; pull the results.

    The job survives a dropped connection or a killed dflash: resume with --attach JOB.
    """
    inv = inventory(inventory_path)
    if sum(bool(x) for x in (checkpoint, attach, cancel)) != 1:
        raise DflashError("give exactly one of --checkpoint NAME, --attach JOB, --cancel JOB")
    if hosts:
        if host or attach or cancel or detach:
            raise DflashError("--hosts runs a sharded eval to the end; it does not combine "
                              "with --host, --attach, --cancel or --detach")
        names = [n.strip() for n in hosts.split(",") if n.strip()]
    name = remote_eval.eval_host_name(inv, host) if not hosts else None
    if cancel:
        with open_host(inv.host(name), inv) as h:
            out = remote_eval.cancel(h, cancel)
        if json_out:
            print_json(out)
        else:
            console.print(f"job {cancel} on {name}: {out['state']} (was {out['was']}; "
                          f"{out['killed']} process(es) stopped)")
        return
    if positions not in (None, "all", "walk"):
        raise DflashError(f"--positions must be 'all' or 'walk', got {positions!r}")
    show = not json_out
    if attach:
        with LiveProgress(show) as live:
            run_dir = remote_eval.attach(inv, name, attach, on_event=live, dest=results)
        _report(run_dir, json_out)
        return
    options = remote_eval.EvalOptions(
        prompts=prompts, samples=samples, seed=seed, max_new_tokens=max_new_tokens,
        thinking=thinking, temperature=temperature, ground_truth=ground_truth,
        ground_truth_kind=ground_truth_kind, ground_truth_model=ground_truth_model,
        target=target, dtype=dtype, threads=threads, budgets=_budgets(budgets), topk=topk,
        device=device, extra={"positions": positions} if positions else {})
    if hosts:
        with ShardProgress(show) as live:
            run_dir = shard.run_sharded(inv, names, checkpoint, options, on_event=live,
                                        dest=results)
        _report(run_dir, json_out)
        return
    if detach:
        spec = inv.host(name)
        with open_host(spec, inv) as h:
            job = remote_eval.build_spec(h, spec, checkpoint, options)
            remote_eval.preflight(h, job)
            ref = remote_eval.start_job(h, job)
        if json_out:
            print_json(ref.to_json())
        else:
            console.print(f"started job {ref.job_id} on {name} (pid {ref.pid}); watch with: "
                          f"dflash remote-eval --attach {ref.job_id}")
        return

    def started(ref: remote_eval.JobRef) -> None:
        # Printed at once (and flushed) so the job id is known even if dflash dies later.
        line = (f"started job {ref.job_id} on {name}"
                f"{' (bundle pushed)' if ref.bundle_pushed else ''}")
        err_console.print(line)
        err_console.file.flush()

    with LiveProgress(show) as live:
        run_dir = remote_eval.run_eval(inv, name, checkpoint, options, on_event=live,
                                       dest=results, on_start=started)
    _report(run_dir, json_out)


def _report(run_dir, json_out: bool) -> None:
    from orchestrator import results as results_mod

    run = results_mod.load_run(run_dir)
    shards = run.result.get("shards")
    if json_out:
        out = {"run_dir": str(run_dir), "run_id": run.run_id,
               "summary": results_mod.summary(run)}
        if shards:
            out["hosts"] = shards["hosts"]
            out["reassigned"] = run.result.get("reassigned", [])
        print_json(out)
        return
    from orchestrator.commands.results import render_summary

    render_summary(run)
    if shards:
        console.print(f"sharded across {', '.join(shards['hosts'])}; ground truth from "
                      f"{shards['ground_truth']['obtained_on']}, one file sliced per shard")
        for r in run.result.get("reassigned", []):
            moved = ", ".join(f"{len(ids)} to {h}" for h, ids in r["to"].items())
            console.print(f"[yellow]{r['host']} failed ({r['reason']}):[/] kept "
                          f"{len(r['kept'])} sample(s), re-ran {moved or 'none'}")
    console.print(f"results: {run_dir}")


def jobs_cmd(
    host: Annotated[Optional[list[str]], typer.Option(
        "--host", "-H", help="Host(s) to ask (default: every host with an eval role).")] = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """List the jobs on eval hosts with their state and progress."""
    inv = inventory(inventory_path)
    specs = inv.expand(host) if host else [h for h in inv.hosts.values() if h.eval]
    rows = []
    for spec in specs:
        with open_host(spec, inv) as h:
            for job in remote_eval.list_jobs(h):
                rows.append({"host": spec.name, **job})
    if json_out:
        print_json(rows)
        return
    table = Table(title="jobs")
    for col in ("host", "job", "state", "checkpoint", "progress", "error"):
        table.add_column(col)
    colors = {"running": "cyan", "done": "green", "failed": "red", "cancelled": "yellow",
              "lost": "red"}
    for r in rows:
        p = r.get("progress") or {}
        if r["state"] == "done":
            prog = "result ready" if r.get("has_result") else "finished"
        elif p.get("event") == "sample":
            prog = f"eval {p.get('done')}/{p.get('total')}"
        elif p.get("event") == "ground_truth":
            prog = f"ground truth {p.get('done')}/{p.get('total')}"
        else:
            prog = p.get("phase") or p.get("event") or "-"
        c = colors.get(r["state"], "white")
        table.add_row(r["host"], r["job_id"], f"[{c}]{r['state']}[/]", r.get("checkpoint") or "-",
                      prog, ((r.get("exit") or {}).get("error") or "")[:80])
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("remote-eval")(remote_eval_cmd)
    app.command("jobs")(jobs_cmd)
