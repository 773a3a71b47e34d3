"""``eval``: offline DFlash acceptance of a drafter against a target, on this host
(``python -m remote eval --spec job.json``; its spec, events and results:
docs/dflash-eval.md, "The host's eval program"). Every check that can fail runs before
any weights load."""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Any

from remote.atomic import write_atomic
from remote.errors import UserError
from remote.eval.inputs import check_compatible, fc_width, read_ground_truth, read_spec
from remote.eval.memory import estimate_bytes
from remote.probe.facts import meminfo, package_version
from remote.protocol import (
    RESULT_SCHEMA,
    TARGET_LOADED_ENDS,
    TARGET_LOADED_WHOLE,
    EvalSpec,
    completion_keys,
    sample_labels,
)
from remote.protocol import metrics as registry

SCHEMA = RESULT_SCHEMA


def environment(dtype: str, threads: int, device, target=None) -> dict[str, Any]:
    """The host's software and settings a result's numbers depend on; `device`'s name (and
    card), how its bfloat16 products were computed (`device.bf16_products`) and, for a
    `target` with linear-attention layers, which kernels ran them (`Target.linear_attention`)."""
    import torch
    import transformers

    from remote.eval import device as device_mod

    return {
        "python": platform.python_version(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "fla": package_version("fla", ("flash-linear-attention", "fla-core", "fla")),
        "causal_conv1d": package_version("causal_conv1d", ("causal-conv1d", "causal_conv1d")),
        "dtype": dtype,
        "threads": threads,
        **device_mod.describe(device),
        "bf16_products": device_mod.bf16_products(device, dtype),
        "linear_attention": getattr(target, "linear_attention", None),
    }


def emit(event: dict[str, Any]) -> None:
    print(json.dumps(event), flush=True)


def sample_event(done: dict[int, dict[str, Any]], index: int, total: int) -> dict[str, Any]:
    """The progress event of sample ``index`` of the job's, just done; ``done``: the records
    done so far by index (the walks end in any order, `remote.eval.walk.eval_stream`)."""
    rec, records = done[index], list(done.values())
    return {
        "event": "sample",
        "done": len(records),
        "total": total,
        "index": index,
        "id": rec["id"],
        "tokens": rec["completion_tokens"],
        "sample_tau": rec["tau"],
        **registry.live_values(records),  # the registry's running values (Metric.live)
        "seconds": rec["seconds"]["total"],
        # The whole record travels with the event, so a watcher keeps the samples a host
        # finished even if that host is lost before it writes samples.jsonl.
        "record": rec,
    }


def run_eval(spec: EvalSpec, on_event=emit, target=None, features=None) -> dict[str, Any]:
    """Run an evaluation from a validated spec (see `read_spec`); returns the result dict
    and writes ``result.json`` + ``samples.jsonl`` in ``output_dir``. `target`: the spec's
    target already loaded in its dtype (`target.load_target`; a job whose local ground truth
    generated with it), used instead of loading it again. `features`: the host's
    `remote.eval.feature_cache.FeatureCache` (None: the target computes every sample's
    features); ``inputs.target_features`` records whether they came from it."""
    import torch

    from remote.eval import cached_features, context_check, costs
    from remote.eval import device as device_mod
    from remote.eval import drafter as drafter_mod
    from remote.eval import target as target_mod
    from remote.eval.metrics import summarize
    from remote.eval.round_timing import Capture, budget
    from remote.eval.walk import WalkOptions, eval_stream
    from remote.model.load import attention_implementation

    t_all = time.perf_counter()
    if spec.threads:
        torch.set_num_threads(spec.threads)
    dtype = getattr(torch, spec.dtype)
    if not os.path.isdir(spec.target):
        raise UserError(f"target folder {spec.target} does not exist")
    if not os.path.exists(spec.drafter):
        raise UserError(f"drafter path {spec.drafter} does not exist")

    # --- checks before any heavy load -----------------------------------------------------
    device = device_mod.resolve(spec.device)
    if target is None:
        _cfg, meta_model, tinfo = target_mod.describe(spec.target)
    else:  # described when it was loaded; its weights are already in memory
        meta_model, tinfo = target.model, target.info
    dcfg = drafter_mod.read_config(spec.drafter, tinfo.num_layers)
    check_compatible(dcfg, tinfo, fc_width(spec.drafter))
    rows = read_ground_truth(spec.ground_truth, tinfo.vocab_size, spec.max_samples)
    tbytes = target_mod.text_weight_bytes(meta_model, tinfo, dtype)
    attn = attention_implementation(meta_model, tinfo)
    del meta_model
    max_len = max(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows)
    window = context_check.exact(dcfg.raw, max_len)  # the preflight warned on its bound
    itemsize = torch.empty(0, dtype=dtype).element_size()
    widens = device_mod.bf16_products(device, spec.dtype) == "float32"
    need = estimate_bytes(
        tbytes, dcfg, max_len, itemsize, spec.block_chunk, spec.positions, spec.sampled, widens
    ) - (0 if target is None else tbytes)
    avail = meminfo()["available"]
    if avail and need > avail:
        raise UserError(
            f"evaluation needs about {need / 2**30:.1f} GiB but {avail / 2**30:.1f} "
            "GiB is available; free memory or use a bigger host"
        )
    os.makedirs(spec.output_dir, exist_ok=True)
    cache = open_cache(features, attn, spec, dcfg, dtype, device, on_event)
    cost_inputs = costs.CostInputs.of(rows, dcfg.block_size, list(spec.budgets), spec.topk)
    cached_costs = cache.lookup_costs(cost_inputs.key()) if cache is not None else None
    # Every feature and the target's round costs cached: the target's layers are never run.
    ends_only = (
        target is None
        and cached_costs is not None
        and all(cache.holds(r["prompt_ids"], r["completion_ids"]) for r in rows)
    )

    on_event(
        {
            "event": "start",
            "samples": len(rows),
            "target": spec.target,
            "drafter": spec.drafter,
            "dtype": spec.dtype,
            "threads": torch.get_num_threads(),
            "block_size": dcfg.block_size,
            "budgets": list(spec.budgets),
            "estimated_bytes": need,
            "target_loaded": target_loaded(not ends_only),
        }
    )
    t0 = time.perf_counter()
    if target is None:
        target = target_mod.load_target(spec.target, dtype, ends_only=ends_only)
    t_target_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    drafter, report = drafter_mod.load_drafter(spec.drafter, dtype, tinfo.num_layers)
    t_drafter_load = time.perf_counter() - t0
    device_mod.place(target, drafter, device)

    opts = WalkOptions(
        budgets=list(spec.budgets),
        topk=spec.topk,
        block_chunk=spec.block_chunk,
        positions=spec.positions,
    )
    seeded = spec.sampled and spec.positions == "walk"  # else the DP after the walk
    if seeded:
        from remote.eval.logits import Processing
        from remote.eval.seeded import Walks

        processing = Processing(spec.temperature, spec.top_k, spec.top_p)
        ids = [r["id"] for r in rows]
        opts.sampler = Walks(target, processing, spec.draft_policy, spec.seed, ids)
    done: dict[int, dict[str, Any]] = {}
    t_eval = time.perf_counter()
    samples = [(r["prompt_ids"], r["completion_ids"]) for r in rows]
    given = None
    if cache is not None:
        given = cached_features.Features(cache, target, dcfg.target_layer_ids, samples, device)
    # the walk's forward over the costs' sample keeps its cache for them (round_timing)
    walker = target if cached_costs is not None else Capture(target, cost_inputs.context)
    with device_mod.computing(device):
        for i, rec in eval_stream(walker, drafter, samples, opts, given):
            done[i] = {
                "id": rows[i]["id"],
                **sample_labels(rows[i]),
                **completion_keys(rows[i]),
                **rec,
            }
            on_event(sample_event(done, i, len(rows)))
    records = [done[i] for i in range(len(rows))]  # samples.jsonl is in the samples' order
    expected = None
    if spec.sampled:  # speculative sampling's acceptance in expectation (docs/dflash-eval.md)
        from remote.eval import sampled

        if seeded:
            method = "seeded" if spec.draft_policy == "sample" else "walk"
            expected = sampled.summarize(records, spec, method)
        else:
            with device_mod.computing(device):
                expected = sampled.annotate(records, samples, target, drafter, spec, given)
    eval_s = time.perf_counter() - t_eval
    target_features = {"cached": False, "cache": "off"}
    if cache is not None:
        target_features = {**cache.summary(len(records)), "cache": "on"}
    t_costs = time.perf_counter()
    walked = walker.context() if isinstance(walker, Capture) else None
    del walker
    with device_mod.computing(device):
        round_costs = measure_costs(
            target, drafter, cost_inputs, cached_costs, cache, device, walked, budget(eval_s)
        )
    del walked
    costs_s = time.perf_counter() - t_costs
    target_features["target_loaded"] = target_loaded(target.whole)
    if cache is not None:
        cache.close()
        for warning in cache.warnings:
            on_event({"event": "warning", "message": warning})

    metrics = summarize(records, dcfg.block_size, list(spec.budgets), spec.topk, tinfo.vocab_size)
    tokens = sum(r["prompt_tokens"] + r["completion_tokens"] for r in records)
    result = {
        "schema": SCHEMA,
        "inputs": {
            "target": os.path.abspath(spec.target),
            "drafter": os.path.abspath(spec.drafter),
            "ground_truth": os.path.abspath(spec.ground_truth),
            "samples": len(rows),
            "max_samples": spec.max_samples,
            "dtype": spec.dtype,
            "positions": spec.positions,
            "block_size": dcfg.block_size,
            "target_layer_ids": dcfg.target_layer_ids,
            "mask_token_id": dcfg.mask_token_id,
            "target_vocab_size": tinfo.vocab_size,
            "ddtree": {"budgets": list(spec.budgets), "topk": spec.topk},
            "drafter_files": report.files,
            "drafter_source_dtypes": report.source_dtypes,
            "drafter_ignored_keys": report.ignored_keys,
            "drafter_parameters": report.parameters,
            "target_architecture": tinfo.architecture,
            "target_backbone": tinfo.backbone_path,
            "target_layers": tinfo.num_layers,
            "target_layer_types": tinfo.layer_types,
            "target_features": target_features,
            "drafter_window": window,
        },
        "environment": environment(spec.dtype, torch.get_num_threads(), device, target),
        "metrics": metrics,
        **({"expected": expected} if expected is not None else {}),
        "timings": {
            "load_target_s": t_target_load,
            "load_drafter_s": t_drafter_load,
            "eval_s": eval_s,
            "target_forward_s": sum(r["seconds"]["target"] for r in records),
            "drafter_s": sum(r["seconds"]["drafter"] for r in records),
            "ddtree_s": sum(r["seconds"]["ddtree"] for r in records),
            "total_s": time.perf_counter() - t_all,
            "tokens": tokens,
            "tokens_per_s": tokens / eval_s if eval_s > 0 else None,
            # one round's costs, measured after the walk (remote.eval.costs), and the
            # seconds measuring them took
            "round_costs": round_costs,
            "round_costs_s": costs_s,
        },
        "samples_file": "samples.jsonl",
    }
    out = spec.output_dir
    lines = "".join(json.dumps(rec) + "\n" for rec in records)
    write_atomic(os.path.join(out, "samples.jsonl"), lines, fsync=True)
    result_path = os.path.join(out, "result.json")
    write_atomic(result_path, json.dumps(result, indent=2), fsync=True)
    on_event(
        {
            "event": "done",
            "result": os.path.abspath(result_path),
            **{m.name: m.read(metrics) for m in registry.live()},
        }
    )
    return result


def target_loaded(whole: bool) -> str:
    """What the result says of the target's load (`remote.protocol.TARGET_LOADED_WHOLE`)."""
    return TARGET_LOADED_WHOLE if whole else TARGET_LOADED_ENDS


def measure_costs(
    target, drafter, inputs, cached: dict | None, cache, device, walked=None, budget_s=None
) -> dict[str, Any]:
    """One round's costs (`remote.eval.costs.measure`): the target's part from the cache
    when it holds it (and kept there when it did not), the drafter's timed. A target
    loaded without its layers times the drafter over the cached features of the costs'
    sample (`cached_features.Features`, which loads the layers should that entry fail).
    `walked`: what the walk's forward over the costs' sample left (`round_timing.Capture`);
    `budget_s`: the seconds the timing may take."""
    from remote.eval import cached_features, costs
    from remote.protocol import TARGET_COSTS

    context = None
    if not target.whole:
        row, layers = inputs.row, drafter.cfg.target_layer_ids
        given = cached_features.Features(
            cache, target, layers, [(row["prompt_ids"], row["completion_ids"])], device
        )
        context = given[0][0][: len(inputs.ids) - max(inputs.sizes)]
    got = costs.measure(target, drafter, inputs, device, cached, context, walked, budget_s)
    if cache is not None and cached is None and "target_step_s" in got:
        cache.store_costs(inputs.key(), {k: got[k] for k in TARGET_COSTS if k in got})
    return got


def open_cache(features, attn, spec: EvalSpec, dcfg, dtype, device, on_event):
    """This run's `feature_cache.RunCache` (None without a cache, or with a warning
    event when its folder cannot be used); `attn`: the target's attention
    implementation."""
    from remote.eval import feature_context

    if features is None:
        return None
    context = feature_context.run_context(attn, spec.target, dcfg.target_layer_ids, dtype, device)
    hidden = dcfg.hidden_size if spec.sampled else 0  # a sampled eval keeps the final rows
    cache = features.open(context, len(dcfg.target_layer_ids) * dcfg.hidden_size, hidden)
    if isinstance(cache, str):
        on_event({"event": "warning", "message": cache})
        return None
    return cache


def run(args) -> int:
    run_eval(read_spec(args.spec))
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "eval", help="offline DFlash acceptance of a drafter against a target (JSON-lines progress)"
    )
    p.add_argument("--spec", required=True, help="job spec JSON (see remote/eval/engine.py)")
    p.set_defaults(func=run)
