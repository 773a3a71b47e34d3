"""The demo's models, built once and cached: a tiny VLM target and drafter checkpoints.

What is built and how it is cached: docs/demo.md.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.eval.prompt_sets import builtin_prompt_sets

# Few checkpoints: each costs a relay, a probe and an eval; at these steps tau visibly rises.
STEPS = (0, 150, 600)
BLOCK_SIZE = 4
RANDOM_PROMPTS = 48
RANDOM_PROMPT_LEN = 10
TRAIN_SETS = ("math", "code")
TRAIN_NEW_TOKENS = 48
SEED = 0
RECIPE = {
    "target": "qwen3.5-vl-tiny",
    "steps": STEPS,
    "block_size": BLOCK_SIZE,
    "random_prompts": RANDOM_PROMPTS,
    "random_prompt_len": RANDOM_PROMPT_LEN,
    "train_sets": TRAIN_SETS,
    "train_new_tokens": TRAIN_NEW_TOKENS,
    "seed": SEED,
    "lr": 3e-3,
    "batch_samples": 4,
    "blocks_per_sample": 16,
}
MARKER = "COMPLETE"

Status = Callable[[str], None]


@dataclass
class DemoAssets:
    """A built cache entry."""

    root: Path
    target: Path
    checkpoints: list[Path]  # ascending step
    built_now: bool = False

    @classmethod
    def read(cls, root: Path) -> DemoAssets:
        meta = json.loads((root / "demo.json").read_text())
        return cls(root, root / meta["target"], [root / c for c in meta["checkpoints"]])


def cache_base() -> Path:
    """``$DFLASH_CACHE_DIR``, else ``$XDG_CACHE_HOME/dflash``, else ``~/.cache/dflash``."""
    if os.environ.get("DFLASH_CACHE_DIR"):
        return Path(os.environ["DFLASH_CACHE_DIR"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "dflash"


def version() -> str:
    """Hash of the recipe, the code that builds it and the library versions."""
    import torch
    import transformers

    here = Path(__file__).resolve().parent
    h = hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode())
    for name in ("build.py", "models.py", "train.py", "gtserver.py"):
        h.update((here / name).read_bytes())
    for drafter in sorted((here.parent.parent / "remote" / "eval").glob("drafter*.py")):
        h.update(drafter.read_bytes())
    h.update(f"{torch.__version__} {transformers.__version__}".encode())
    return h.hexdigest()[:16]


def ensure_assets(
    fresh: bool = False, base: Path | None = None, status: Status | None = None
) -> DemoAssets:
    """The cached demo models, built first when missing (or when `fresh`)."""
    status = status or (lambda _msg: None)
    base = Path(base or cache_base()) / "demo"
    base.mkdir(parents=True, exist_ok=True)
    root = base / version()
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two demos started together build once
        if fresh and root.exists():
            shutil.rmtree(root)
        if (root / "demo.json").is_file():
            status(f"models: cached in {root}")
            return DemoAssets.read(root)
        partial = base / f".{root.name}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        try:
            _build(partial, status)
            os.replace(partial, root)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    assets = DemoAssets.read(root)
    assets.built_now = True
    return assets


def _build(out: Path, status: Status) -> None:
    import torch

    from orchestrator.demo.gtserver import Greedy
    from orchestrator.demo.models import build_qwen35_vl_target
    from orchestrator.demo.train import train_drafter
    from remote.eval.groundtruth import load_prompts, render_prompt

    # Tiny models: more threads only contend on a shared machine (docs/demo.md).
    torch.set_num_threads(1)
    status("building the tiny Qwen3.5-VL target and its tokenizer")
    target = out / "target"
    build_qwen35_vl_target(str(target), seed=SEED)
    status("making training data: the target's own greedy completions")
    greedy = Greedy(str(target))
    rng = random.Random(SEED + 1)
    vocab = greedy.model.config.vocab_size
    prompts = [
        [rng.randrange(8, vocab) for _ in range(RANDOM_PROMPT_LEN)] for _ in range(RANDOM_PROMPTS)
    ]
    rows = [
        {"id": f"random-{i}", "prompt_ids": p, "completion_ids": c}
        for i, (p, c) in enumerate(
            zip(prompts, greedy.batch(prompts, TRAIN_NEW_TOKENS), strict=False)
        )
    ]
    sets = builtin_prompt_sets()
    for name in TRAIN_SETS:
        for rec in load_prompts(str(sets[name])):
            _, ids = render_prompt(greedy.tokenizer, rec["text"], False)
            rows.append(
                {
                    "id": rec["id"],
                    "prompt_ids": ids,
                    "completion_ids": greedy(ids, TRAIN_NEW_TOKENS),
                }
            )
    status(
        f"training the DFlash drafter on {len(rows)} samples, checkpoints at steps "
        f"{', '.join(map(str, STEPS))}"
    )
    paths = train_drafter(
        str(target),
        str(out / "checkpoints"),
        save_steps=STEPS,
        block_size=BLOCK_SIZE,
        rows=rows,
        seed=SEED,
        lr=RECIPE["lr"],
        batch_samples=RECIPE["batch_samples"],
        blocks_per_sample=RECIPE["blocks_per_sample"],
    )
    (out / "demo.json").write_text(
        json.dumps(
            {
                "recipe": RECIPE,
                "target": "target",
                "checkpoints": [str(Path(p).relative_to(out)) for p in paths],
            },
            indent=2,
        )
    )
