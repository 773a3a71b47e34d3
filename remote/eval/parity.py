"""``parity`` jobs: is the tau measured on this host the tau another host's numerics give?

Two job kinds, run by the job runner (`remote.jobs.run`) like eval jobs (progress in
events.jsonl, attach, cancel):

``parity-capture``
    Ground truth (the eval's cache, or a file another host's capture used), then ONE forward
    of the target's text part per sample over prompt + completion ids, on the job's
    ``device`` in its ``dtype`` (optionally another attention implementation). Saves, per
    sample, ``capture/NNNN.safetensors``: ``ids`` [T], ``layer.<i>`` [T, hidden] (the raw
    output of decoder layer i, in the compute dtype), ``topk.values`` / ``topk.ids``
    [T, k] of the final logits (float32); and ``result.json`` (schema
    ``dflash.parity-capture/1``): layers, prompt lengths, dtype, device, kernels, versions.

``parity-compare``
    On host B, after A's capture folder was streamed here: per layer cosine similarity,
    relative L2 error (``|a - b| / |a|``, A the reference) and max abs error per token, as
    percentiles over all tokens; top-1 agreement of the logits; with a drafter, the
    drafter's acceptance walk (`remote.walk.eval_sequence`, the eval engine's own code)
    fed A's features and B's features over the same ground truth: tau_A, tau_B, delta tau
    and the first round where the walks diverge, per sample. Writes ``result.json``
    (schema ``dflash.parity/1``).
"""

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
    PARITY_SCHEMA,
    EvalSpec,
    JobKind,
    is_int,
)

CAPTURE_DIR = "capture"
PERCENTILES = (50, 90, 99)


# ---- capture ------------------------------------------------------------------------------


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
    from remote.eval.engine import environment, read_ground_truth
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


# ---- compare ------------------------------------------------------------------------------


def _stats(values, low_is_bad: bool = False) -> dict[str, float]:
    """Mean and percentiles over tokens (the worst tail: low percentiles for cosine)."""
    import torch

    v = values.double()
    out = {"mean": float(v.mean())}
    for p in PERCENTILES:
        q = (100 - p) / 100 if low_is_bad else p / 100
        out[f"p{100 - p}" if low_is_bad else f"p{p}"] = float(torch.quantile(v, q))
    out["min" if low_is_bad else "max"] = float(v.min() if low_is_bad else v.max())
    return out


def layer_errors(a, b) -> dict[str, Any]:
    """Per token of one layer (A the reference): cosine similarity, relative L2 error and
    max abs error, computed in float64. A token whose rows are bit-identical has cosine
    exactly 1 (not 1 - 1e-16 from rounding), so identical hosts read exactly 1 and 0."""
    import torch

    a, b = a.double(), b.double()
    diff = a - b
    na, nb = a.norm(dim=-1), b.norm(dim=-1)
    same = (a == b).all(dim=-1)
    cos = torch.where(same, torch.ones_like(na), (a * b).sum(-1) / (na * nb).clamp_min(1e-300))
    rel = torch.where(same, torch.zeros_like(na), diff.norm(dim=-1) / na.clamp_min(1e-300))
    mx = diff.abs().amax(dim=-1)
    return {"cosine": cos, "rel_l2": rel, "max_abs": mx}


def _load_capture(folder: Path) -> dict:
    info = json.loads((folder / "result.json").read_text())
    if info.get("schema") != PARITY_CAPTURE_SCHEMA:
        raise UserError(f"{folder}/result.json is not a parity capture ({info.get('schema')!r})")
    return info


def _file_in(folder: Path, rel: str) -> Path:
    """A capture file named by a capture's result.json, never outside its folder."""
    if not isinstance(rel, str) or rel.startswith("/") or ".." in rel.split("/"):
        raise UserError(f"capture names a file outside its folder: {rel!r}")
    return folder / rel


def run_compare(path: Path, spec: dict, events, engine: EvalSpec) -> int:
    """The compare job (see the module docstring); `engine`: the drafter walked (if any),
    the target it walks with, dtype and device."""
    import torch
    from safetensors.torch import load_file

    from remote.eval import device as device_mod
    from remote.protocol.metrics import walk_stats

    folder_a, folder_b = Path(spec["capture_a"]), Path(spec["capture_b"])
    cap_a, cap_b = _load_capture(folder_a), _load_capture(folder_b)
    if len(cap_a["samples"]) != len(cap_b["samples"]):
        raise UserError(
            f"host A captured {len(cap_a['samples'])} samples, host B "
            f"{len(cap_b['samples'])}; they must share one ground truth"
        )
    if cap_a["hidden_size"] != cap_b["hidden_size"]:
        raise UserError(
            f"the targets differ: hidden size {cap_a['hidden_size']} on A, "
            f"{cap_b['hidden_size']} on B"
        )
    layers = [i for i in cap_b["layers"] if i in cap_a["layers"]]
    if not layers:
        raise UserError(
            f"no layer captured on both hosts (A: {cap_a['layers']}, B: {cap_b['layers']})"
        )

    drafter = target = dcfg = None
    if engine.drafter:
        from remote.eval import drafter as drafter_mod
        from remote.eval.target import load_target

        dcfg = drafter_mod.read_config(engine.drafter, cap_b["target_layers"])
        missing = [i for i in dcfg.target_layer_ids if i not in layers]
        if missing:
            raise UserError(
                f"the drafter reads target layers {dcfg.target_layer_ids} but "
                f"{missing} were not captured on both hosts; rerun with --layers "
                "including them (or without --layers)"
            )
        device = device_mod.resolve(engine.device)
        dtype = getattr(torch, engine.dtype)
        events.emit("phase", phase="load")
        target = load_target(engine.target, dtype)
        drafter, _report = drafter_mod.load_drafter(engine.drafter, dtype, target.info.num_layers)
        device_mod.place(target, drafter, device)
    else:
        device = device_mod.resolve("cpu")

    events.emit("phase", phase="compare")
    events.emit("start", samples=len(cap_b["samples"]), layers=layers)
    per_layer: dict[int, dict[str, list]] = {
        i: {"cosine": [], "rel_l2": [], "max_abs": []} for i in layers
    }
    top1_match = top1_total = 0
    walks = []
    for n, (sa, sb) in enumerate(zip(cap_a["samples"], cap_b["samples"], strict=False)):
        ta = load_file(str(_file_in(folder_a, sa["file"])))
        tb = load_file(str(_file_in(folder_b, sb["file"])))
        if not torch.equal(ta["ids"], tb["ids"]) or sa["prompt_tokens"] != sb["prompt_tokens"]:
            raise UserError(
                f"sample {n} ({sb['id']}): the hosts ran different token ids; "
                "they must share one ground truth"
            )
        for i in layers:
            for k, v in layer_errors(ta[f"layer.{i}"], tb[f"layer.{i}"]).items():
                per_layer[i][k].append(v)
        P = sb["prompt_tokens"]
        ga, gb = ta["topk.ids"][P - 1 : -1, 0], tb["topk.ids"][P - 1 : -1, 0]
        top1_match += int((ga == gb).sum())
        top1_total += len(gb)
        if drafter is not None:
            walks.append(_walks(target, drafter, dcfg, ta, tb, P, sb["id"], device))
        events.emit(
            "sample",
            done=n + 1,
            total=len(cap_b["samples"]),
            id=sb["id"],
            tokens=int(tb["ids"].numel()),
            **({"tau_a": walks[-1]["tau_a"], "tau_b": walks[-1]["tau_b"]} if walks else {}),
        )
    layer_rows = []
    for i in layers:
        cat = {k: torch.cat(v) for k, v in per_layer[i].items()}
        layer_rows.append(
            {
                "layer": i,
                "tokens": int(cat["cosine"].numel()),
                "cosine": _stats(cat["cosine"], low_is_bad=True),
                "rel_l2": _stats(cat["rel_l2"]),
                "max_abs": _stats(cat["max_abs"]),
                "identical": bool((cat["max_abs"] == 0).all()),
            }
        )
    result: dict[str, Any] = {
        "schema": PARITY_SCHEMA,
        "hosts": {"a": cap_a.get("host"), "b": cap_b.get("host")},
        "captures": {"a": _side(cap_a), "b": _side(cap_b)},
        "samples": len(cap_b["samples"]),
        "tokens": sum(r["tokens"] for r in layer_rows[:1]),
        "layers": layer_rows,
        "top1_agreement": {
            "match": top1_match,
            "total": top1_total,
            "rate": top1_match / top1_total if top1_total else None,
        },
        "identical": all(r["identical"] for r in layer_rows) and top1_match == top1_total,
    }
    if drafter is not None:
        sa_ = walk_stats([w["rounds_a"] for w in walks])
        sb_ = walk_stats([w["rounds_b"] for w in walks])
        result["drafter"] = {
            "path": os.path.abspath(engine.drafter),
            "target_layer_ids": dcfg.target_layer_ids,
            "block_size": dcfg.block_size,
            "walks_on": cap_b.get("host"),
            "dtype": engine.dtype,
            "device": str(device),
            "tau_a": sa_["tau_per_sample_mean"],
            "tau_b": sb_["tau_per_sample_mean"],
            "delta_tau": sb_["tau_per_sample_mean"] - sa_["tau_per_sample_mean"],
            "tau_a_token_weighted": sa_["tau_token_weighted"],
            "tau_b_token_weighted": sb_["tau_token_weighted"],
            "samples_diverging": sum(w["first_diverging_round"] is not None for w in walks),
            "per_sample": walks,
        }
    write_json_atomic(path / "result.json", result)
    events.emit(
        "done",
        result=str(path / "result.json"),
        delta_tau=(result.get("drafter") or {}).get("delta_tau"),
    )
    return 0


def _side(cap: dict) -> dict:
    keep = (
        "host",
        "target",
        "target_architecture",
        "target_layers",
        "target_layer_types",
        "layers",
        "dtype",
        "attn",
        "device",
        "kernels",
        "environment",
        "ground_truth",
        "timings",
    )
    return {k: cap.get(k) for k in keep}


def _walks(target, drafter, dcfg, ta: dict, tb: dict, P: int, sid, device) -> dict:
    """The drafter's walk on A's features and on B's, over the same ids (the eval engine's
    `eval_sequence` with given features; B's target lends embedding and head to both)."""
    import torch

    from remote.eval import device as device_mod
    from remote.eval.walk import WalkOptions, eval_sequence

    g = ta["ids"].tolist()
    prompt, completion = g[:P], g[P:]
    recs = {}
    for side, t in (("a", ta), ("b", tb)):
        feats = torch.cat([t[f"layer.{i}"] for i in dcfg.target_layer_ids], dim=-1)
        greedy = t["topk.ids"][P - 1 :, 0]
        with device_mod.computing(device):
            recs[side] = eval_sequence(
                target,
                drafter,
                prompt,
                completion,
                WalkOptions(),
                given=(feats.to(device), greedy.to(device)),
            )
    ra, rb = recs["a"]["rounds"], recs["b"]["rounds"]
    first = next((k for k, (x, y) in enumerate(zip(ra, rb, strict=False)) if x != y), None)
    if first is None and len(ra) != len(rb):
        first = min(len(ra), len(rb))
    return {
        "id": sid,
        "rounds_a": ra,
        "rounds_b": rb,
        "tau_a": recs["a"]["tau"],
        "tau_b": recs["b"]["tau"],
        "first_diverging_round": first,
    }


# ---- job entry ----------------------------------------------------------------------------


def run_job(path: Path, spec: dict, events, *, preflight: bool = False) -> int:
    """Dispatch a parity job by its kind (called by `remote.jobs.run`). `preflight` is not
    used: the controller checks both hosts before their captures start."""
    from remote.eval.job import job_engine

    kind = spec.get("kind")
    engine = job_engine(spec)
    if kind == JobKind.CAPTURE:
        return run_capture(path, spec, events, engine)
    if kind == JobKind.COMPARE:
        return run_compare(path, spec, events, engine)
    raise UserError(f"unknown job kind {kind!r}")
