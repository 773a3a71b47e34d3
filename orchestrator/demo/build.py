"""The demo's models, built once and cached: a tiny Qwen3.5-style vision-language target with
its tokenizer, and DFlash drafter checkpoints at several training steps.

The drafter is trained for real on CPU on the target's OWN greedy completions (random-token
prompts, and the built-in ``math`` and ``code`` prompt sets through the chat template); the
demo then evaluates it on the ``chat`` set, prompts it never saw, so tau rising with the step
is learning, not recall. Everything lands in ``<cache>/<version>/`` where the version hashes
this recipe, the code that builds it and the torch/transformers versions: a change to any of
them builds afresh, nothing else does. A build goes into a hidden folder renamed into place
at the end (an interrupted build leaves no half cache) under a file lock (two demos started
together build once).
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

# The recipe. Three checkpoints: each costs the demo a relay, a probe and an eval (Python
# start-ups dominate on 2 cores); at these steps tau visibly rises (about 1.0, 1.6-2.0, 2.6
# on the chat set). Training all 600 steps takes seconds on one core.
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
MARKER = "COMPLETE"  # what the demo trainer writes when a checkpoint is finished

Status = Callable[[str], None]


@dataclass
class DemoAssets:
    """A built cache entry."""

    root: Path
    target: Path
    checkpoints: list[Path]  # drafter checkpoint folders, ascending step
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
    # the drafter's code: its checkpoint reader and writer, config, layers and forward
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
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second demo waits for the first one's build
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

    # Tiny models: one thread is fastest, and on a shared 2-core box more threads only
    # contend (measured: training 150 steps took 2 s on one thread, 90 s on two under load).
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
