"""The ``parity-capture`` job: one target forward per sample, its chosen layers' raw
outputs and the logits' top-k saved for the other host (docs/parity.md)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from remote.atomic import write_json_atomic
from remote.errors import UserError
from remote.protocol import (
    PARITY_CAPTURE_SCHEMA,
    EvalSpec,
    is_int,
)

CAPTURE_DIR = "capture"


def kernels() -> dict[str, Any]:
    """Which linear-attention kernels this host's Python can import (the trainer's GPU has
    them; a CPU host usually runs transformers' torch fallback), with versions."""
    from remote.probe.facts import package_version

    out = {}
    for name, module, dists in (
        ("fla", "fla", ("flash-linear-attention", "fla-core", "fla")),
        ("causal_conv1d", "causal_conv1d", ("causal-conv1d", "causal_conv1d")),
    ):
        version = package_version(module, dists)
        out[name] = {"available": version is not None, "version": version}
    return out


def capture_layers(layers: tuple[int, ...] | None, num_layers: int, drafter: str = "") -> list[int]:
    """The layers to capture: the job's `layers`, else the drafter's target layers, else
    all, each inside the target's `num_layers`."""
    if layers is None and drafter:
        from remote.eval.drafter import read_config

        layers = list(read_config(drafter, num_layers).target_layer_ids)
    if layers is None:
        layers = list(range(num_layers))
    bad = [i for i in layers if not is_int(i) or not 0 <= i < num_layers]
    if bad or not layers:
        raise UserError(
            f"layers {bad or layers} are outside the target's {num_layers} layers "
            f"(0..{num_layers - 1})"
        )
    return sorted(set(layers))


def run_capture(path: Path, spec: dict, events, engine: EvalSpec) -> int:
    """The capture job (see the module docstring); `engine`: its target, drafter, dtype,
    device and threads."""
    import torch
    from safetensors.torch import save_file

    from remote.eval import device as device_mod
    from remote.eval import groundtruth
    from remote.eval.engine import environment
    from remote.eval.inputs import read_ground_truth
    from remote.eval.preflight import read_job
    from remote.eval.target import describe, load_target

    job = read_job(spec)  # attn, layers, topk: checked there
    device = device_mod.resolve(engine.device)  # before anything slow
    attn = job.attn
    dtype_name = engine.dtype
    if not os.path.isdir(engine.target):
        raise UserError(f"target folder {engine.target or None} does not exist on this host")
    _cfg, _meta, info = describe(engine.target)
    del _meta
    layers = capture_layers(job.layers, info.num_layers, engine.drafter)
    topk = job.topk

    events.emit("phase", phase="ground_truth", source=job.ground_truth.kind)
    gt_path, gt_info = groundtruth.prepare(job, emit=events.emit, engine=engine)
    (path / "ground_truth.json").write_text(json.dumps(gt_info, indent=2, default=str))
    rows = read_ground_truth(gt_path, info.vocab_size, None)

    if engine.threads:
        torch.set_num_threads(engine.threads)
    events.emit("phase", phase="capture")
    events.emit("start", samples=len(rows), layers=layers, dtype=dtype_name, device=str(device))
    t0 = time.perf_counter()
    target = load_target(engine.target, getattr(torch, dtype_name))
    if attn is not None:
        target.model.set_attn_implementation(attn)
    device_mod.place(target, None, device)
    load_s = time.perf_counter() - t0
    out_dir = path / CAPTURE_DIR
    out_dir.mkdir(exist_ok=True)
    files, samples = [], []
    agree = [0, 0]  # the target's argmax equal to the ground-truth token, of completion ones
    t1 = time.perf_counter()
    for n, row in enumerate(rows):
        g = row["prompt_ids"] + row["completion_ids"]
        with device_mod.computing(device):
            feats, last = target.hidden(g, layers)
            logits = torch.cat(
                [target.head(last[a : a + 256]).float() for a in range(0, last.shape[0], 256)]
            )
            values, ids = torch.topk(logits, min(topk, logits.shape[-1]), dim=-1)
        p = len(row["prompt_ids"])
        agree[0] += int((ids[p - 1 : -1, 0].cpu() == torch.tensor(g[p:])).sum())
        agree[1] += len(g) - p
        tensors = {
            "ids": torch.tensor(g, dtype=torch.long),
            "topk.values": values.cpu().contiguous(),
            "topk.ids": ids.cpu().contiguous(),
        }
        for i, part in zip(layers, torch.split(feats, info.hidden_size, dim=-1), strict=False):
            tensors[f"layer.{i}"] = part.cpu().contiguous().clone()
        name = f"{n:04d}.safetensors"
        save_file(tensors, str(out_dir / name))
        files.append(f"{CAPTURE_DIR}/{name}")
        samples.append(
            {
                "id": row["id"],
                "prompt_tokens": len(row["prompt_ids"]),
                "completion_tokens": len(row["completion_ids"]),
                "file": files[-1],
            }
        )
        events.emit("sample", done=n + 1, total=len(rows), id=row["id"], tokens=len(g))
    # A ground truth this target disagrees with wholesale is flagged and leaves the cache.
    rate = agree[0] / agree[1] if agree[1] else None
    gt_info = groundtruth.judge(gt_info, {"rate": rate}, path, emit=events.emit)
    (path / "ground_truth.json").write_text(json.dumps(gt_info, indent=2, default=str))
    result = {
        "schema": PARITY_CAPTURE_SCHEMA,
        "host": spec.get("host"),
        "target": os.path.abspath(engine.target),
        "target_architecture": info.architecture,
        "target_layers": info.num_layers,
        "target_layer_types": info.layer_types,
        "hidden_size": info.hidden_size,
        "layers": layers,
        "topk": topk,
        "dtype": dtype_name,
        "attn": attn or "default",
        "device": device_mod.describe(device),
        "kernels": kernels(),
        "environment": environment(dtype_name, torch.get_num_threads(), device, target),
        "samples": samples,
        "files": files,
        "ground_truth": {
            k: gt_info.get(k) for k in ("kind", "url", "path", "cached", "file", "suspect")
        },
        "timings": {"load_target_s": load_s, "forward_s": time.perf_counter() - t1},
    }
    write_json_atomic(path / "result.json", result)
    events.emit("done", result=str(path / "result.json"))
    return 0
