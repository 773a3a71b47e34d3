"""The ``parity-compare`` job (a capture streamed from the other host against this host's)
and the runner's entry for both parity kinds (docs/parity.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from remote.atomic import write_json_atomic
from remote.errors import UserError
from remote.eval.parity_capture import run_capture
from remote.protocol import (
    PARITY_CAPTURE_SCHEMA,
    PARITY_SCHEMA,
    EvalSpec,
    JobKind,
)

PERCENTILES = (50, 90, 99)


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
