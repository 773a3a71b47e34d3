"""``dflash demo``: the whole loop on this machine, through the commands' own library
calls (docs/demo.md)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from orchestrator.demo import build
from orchestrator.errors import DflashError
from orchestrator.eval import run as remote_eval
from orchestrator.eval.follow import loop as follow
from orchestrator.inventory import load_inventory
from remote.model.quiet import transformers_quiet
from remote.protocol import EvalSpec

TRAINER = "demo-trainer"
EVAL_HOST = "demo-eval"
EVAL_PROMPTS = "chat"  # the drafter trained on math and code: chat prompts are unseen
EVAL_SAMPLES = 8
EVAL_NEW_TOKENS = 48
BUDGETS = (4, 8, 16)


@dataclass
class DemoOptions:
    """The demo's options (``--fresh``, ``--keep-dir``; docs/demo.md)."""

    fresh: bool = False
    keep_dir: str | os.PathLike | None = None
    cache_dir: str | os.PathLike | None = None
    setup_seconds: float | None = None


@dataclass
class DemoResult:
    history: list[dict]
    plot: Path | None
    results_dir: Path
    folder: Path | None  # when kept
    models: Path
    built_now: bool
    seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "history": self.history,
            "plot": str(self.plot) if self.plot else None,
            "results_dir": str(self.results_dir),
            "folder": str(self.folder) if self.folder else None,
            "models": str(self.models),
            "built_now": self.built_now,
            "seconds": {k: round(v, 1) for k, v in self.seconds.items()},
        }


def write_inventory(folder: Path, assets: build.DemoAssets, gt_url: str) -> Path:
    """The demo's inventory: two local hosts in the trainer and eval roles."""
    doc = {
        "defaults": {
            "relay_from": TRAINER,
            "relay_to": EVAL_HOST,
            "eval_host": EVAL_HOST,
            "results_dir": str(folder / "results"),
        },
        "hosts": {
            TRAINER: {
                "transport": "local",
                # Whichever dflash reads a kept inventory, its hosts run the python with torch.
                "python": sys.executable,
                "workdir": str(folder / "trainer" / "dflash"),
                "roles": {
                    "trainer": {
                        "checkpoints": str(folder / "trainer" / "checkpoints"),
                        "complete_rule": "marker",
                        "marker": build.MARKER,
                    }
                },
            },
            EVAL_HOST: {
                "transport": "local",
                "python": sys.executable,
                "workdir": str(folder / "eval" / "dflash"),
                "roles": {
                    "eval": {
                        "drafters": str(folder / "eval" / "drafters"),
                        "target_model": str(assets.target),
                        "ground_truth": gt_url,
                        "ground_truth_kind": "sglang",
                        "samples": EVAL_SAMPLES,
                        "max_new_tokens": EVAL_NEW_TOKENS,
                        "threads": 1,
                        "dtype": "float32",
                    }
                },
            },
        },
    }
    path = folder / "inventory.yaml"
    path.write_text(
        "# written by `dflash demo`: two local hosts\n" + yaml.safe_dump(doc, sort_keys=False)
    )
    return path


def _lay_out(folder: Path, assets: build.DemoAssets) -> None:
    ckpts = folder / "trainer" / "checkpoints"
    ckpts.mkdir(parents=True)
    (folder / "eval" / "drafters").mkdir(parents=True)
    for src in assets.checkpoints:
        dst = ckpts / src.name
        shutil.copytree(src, dst)
        (dst / build.MARKER).write_text("")


def _wait_for_processes(folder: Path, timeout: float = 20.0) -> None:
    """Wait for the processes naming the demo folder (a job runner may still be exiting),
    then stop any left: they are the demo's own."""
    import psutil

    def ours() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if p.pid != os.getpid() and any(str(folder) in a for a in p.info["cmdline"] or []):
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    deadline = time.monotonic() + timeout
    while (left := ours()) and time.monotonic() < deadline:
        psutil.wait_procs(left, timeout=0.5)
    for p in ours():
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def run_demo(
    options: DemoOptions | None = None, events: follow.FollowEvents | None = None
) -> DemoResult:
    """Build (once) and run the demo; returns the follow history and the plot's path."""
    # transformers' lines about its in-process tiny models tell the user nothing.
    with transformers_quiet():
        return _run_demo(options or DemoOptions(), events or follow.FollowEvents())


def _run_demo(options: DemoOptions, events: follow.FollowEvents) -> DemoResult:
    from orchestrator.demo.gtserver import GroundTruthServer

    clock = {"start": time.monotonic()}
    if options.keep_dir:  # checked before the (maybe long) build
        folder = Path(options.keep_dir).expanduser().resolve()
        if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
            raise DflashError(
                f"--keep-dir {folder} exists and is not an empty folder; name a new one"
            )
    assets = build.ensure_assets(options.fresh, options.cache_dir, events.message)
    clock["models"] = time.monotonic()
    if options.keep_dir:
        folder.mkdir(parents=True, exist_ok=True)
        results = folder / "results"
    else:
        folder = Path(tempfile.mkdtemp(prefix="dflash-demo-"))
        results = assets.root.parent / "last-run"
        shutil.rmtree(results, ignore_errors=True)
    try:
        import torch

        torch.set_num_threads(1)  # as build._build
        _lay_out(folder, assets)
        events.message("starting the ground-truth server (SGLang-shaped /generate)")
        with GroundTruthServer(str(assets.target), model_name="demo-target") as server:
            inv_path = write_inventory(folder, assets, server.url)
            inv = load_inventory(inv_path)
            events.message(f"inventory: {inv_path}; ground truth at {server.url}")
            opts = follow.FollowOptions(
                probe=True,
                results_dir=results,
                eval=remote_eval.EvalOptions(
                    prompts=EVAL_PROMPTS, engine=EvalSpec(budgets=BUDGETS)
                ),
            )
            clock["ready"] = time.monotonic()
            follow.follow_pass(inv, TRAINER, EVAL_HOST, opts, events)
            state = follow.state_dir(inv, TRAINER, EVAL_HOST, opts)
        clock["done"] = time.monotonic()
        history = follow.read_history(state)
        plot = state / follow.PLOT
        return DemoResult(
            history=history,
            plot=plot if plot.is_file() else None,
            results_dir=results,
            folder=folder if options.keep_dir else None,
            models=assets.root,
            built_now=assets.built_now,
            seconds={
                **({"setup": options.setup_seconds} if options.setup_seconds is not None else {}),
                "models": clock["models"] - clock["start"],
                "hosts": clock["ready"] - clock["models"],
                "relay_probe_eval": clock["done"] - clock["ready"],
                "total": clock["done"] - clock["start"] + (options.setup_seconds or 0),
            },
        )
    finally:
        _wait_for_processes(folder)
        if not options.keep_dir:
            shutil.rmtree(folder, ignore_errors=True)
