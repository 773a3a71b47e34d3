"""`dflash follow`: relay and evaluate each new checkpoint of a training run, exactly once."""

from __future__ import annotations

import signal
import time
from typing import Annotated, Optional

import typer
from rich import box
from rich.table import Table

from orchestrator.eval import follow as follow_lib
from orchestrator.eval import run as remote_eval
from orchestrator.commands.common import (BudgetsOption, DtypeOption, InventoryOption, JsonOption, console,
                                          err_console, inventory, positive, print_json)
from orchestrator.commands.relay import _RichProgress
from orchestrator.commands.remote_eval import LiveProgress
from orchestrator.errors import DflashError


class RichEvents(follow_lib.FollowEvents):
    """Timestamped lines, the relay's byte bar and the eval's live bar, on stderr."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.relay_bar: _RichProgress | None = None
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
        self.relay_bar = _RichProgress()
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
            err_console.print(f"[red]{entry['checkpoint']}: failed[/]: {entry.get('error')}",
                              soft_wrap=True)
            return
        trees = ", ".join(f"DDTree-{b} {v:.3f}" for b, v in entry["ddtree"].items()
                          if v is not None)
        err_console.print(f"[bold green]{entry['checkpoint']}[/] (step {entry['step']}): "
                          f"tau {_f(entry['tau'])} (token-weighted {_f(entry['tau_tokens'])})"
                          + (f", {trees}" if trees else ""), soft_wrap=True)

    def close(self) -> None:
        self._close()


def _f(v) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) else "-"


def history_table(history: list[dict], title: str = "tau per checkpoint step") -> Table:
    """Step, checkpoint, tau (z-lab per-sample mean and token-weighted), DDTree tau per node
    budget and the target agreement rate; run ids are in the history JSON."""
    budgets = sorted({b for h in history for b in (h.get("ddtree") or {})}, key=int)
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True,
                  pad_edge=False, show_edge=False)  # fits 80 columns
    for col in ("step", "checkpoint", "tau", "tau tok", *[f"DDTree-{b}" for b in budgets],
                "agree"):
        table.add_column(col, justify="left" if col == "checkpoint" else "right",
                         no_wrap=True)
    for h in sorted(history, key=lambda h: (h.get("step") is None, h.get("step") or 0)):
        if h.get("state") != "done":
            table.add_row(str(h.get("step")), h["checkpoint"],
                          f"[red]failed[/]: {(h.get('error') or '')[:60]}", "",
                          *[""] * len(budgets), "")
            continue
        table.add_row(str(h.get("step")), h["checkpoint"], _f(h.get("tau")),
                      _f(h.get("tau_tokens")),
                      *[_f((h.get("ddtree") or {}).get(b)) for b in budgets],
                      _f(h.get("target_agreement")))
    return table


def follow_cmd(
    ctx: typer.Context,
    source: Annotated[Optional[str], typer.Option(
        "--from", help="Trainer host (default: defaults.relay_from).")] = None,
    dest: Annotated[Optional[str], typer.Option(
        "--to", help="Eval host (default: defaults.relay_to).")] = None,
    keep: Annotated[Optional[int], typer.Option(
        "--keep", min=1, help="Keep only the newest K relayed checkpoints on the eval host "
                              "(pruned after each eval; default: defaults.keep).")] = None,
    interval: Annotated[float, typer.Option(
        "--interval", callback=positive, help="Seconds between looks at the trainer.")
    ] = 60.0,
    once: Annotated[bool, typer.Option(
        "--once", help="One pass (evaluate what is new now), then exit.")] = False,
    probe: Annotated[bool, typer.Option(
        "--probe/--no-probe", help="Check each checkpoint fits the target (probe-structure) "
                                   "before evaluating it.")] = False,
    prompts: Annotated[Optional[str], typer.Option(
        help="Built-in set (math, code, chat), a local JSONL file, or host:/path "
             "(default: the inventory's).")] = None,
    samples: Annotated[Optional[int], typer.Option(min=1, help="Prompts per eval.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(
        min=1, help="Ground-truth completion length.")] = None,
    budgets: BudgetsOption = None,
    dtype: DtypeOption = None,
    results: Annotated[Optional[str], typer.Option(
        "--results-dir", help="Local results folder (default: defaults.results_dir).")] = None,
    state: Annotated[Optional[str], typer.Option(
        "--state-dir", help="Follow folder: history, state, plot (default: "
                            "<results>/follow/<from>-to-<to>).")] = None,
    tensorboard: Annotated[Optional[str], typer.Option(
        "--tensorboard", metavar="DIR", help="Also log each run's tau, token-weighted tau, "
        "DDTree tau per budget and agreement to TensorBoard event files under DIR, at the "
        "checkpoint's training step.")] = None,
    wandb: Annotated[Optional[str], typer.Option(
        "--wandb", metavar="PROJECT", help="Also log them to this W&B project (offline "
        "files in the follow folder unless WANDB_MODE=online; upload with wandb sync).")
    ] = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Relay and evaluate every new checkpoint of a training run, exactly once.

    Appends to a history and redraws the tau-per-step plot. Safe to stop and restart:
    Ctrl-C cancels the running eval job; a restart attaches to a job it left running."""
    inv = inventory(ctx, inventory_path)
    src = source or inv.defaults.relay_from
    dst = dest or inv.defaults.relay_to
    if not src or not dst:
        raise DflashError("follow needs --from TRAINER and --to EVAL_HOST (or "
                          "defaults.relay_from and defaults.relay_to in the inventory)")
    options = follow_lib.FollowOptions(
        keep=keep if keep is not None else inv.defaults.keep, interval=interval, probe=probe,
        results_dir=results, state_dir=state, tensorboard=tensorboard, wandb=wandb,
        eval=remote_eval.EvalOptions(prompts=prompts, samples=samples,
                                     max_new_tokens=max_new_tokens, dtype=dtype,
                                     budgets=budgets))
    # A polite stop (kill, systemd) behaves like Ctrl-C: the running job is cancelled.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    events = RichEvents(enabled=not json_out)
    try:
        if once:
            follow_lib.follow_pass(inv, src, dst, options, events)
        else:
            follow_lib.follow(inv, src, dst, options, events)
    finally:
        events.close()
    folder = follow_lib.state_dir(inv, src, dst, options)
    history = follow_lib.read_history(folder)
    if json_out:
        print_json({"state_dir": str(folder), "history": history,
                    "plot": str(folder / follow_lib.PLOT)})
        return
    console.print(history_table(history))
    plot = folder / follow_lib.PLOT
    if plot.is_file():
        console.print(f"plot: {plot}", soft_wrap=True)
    console.print(f"history: {folder / follow_lib.HISTORY}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("follow")(follow_cmd)
