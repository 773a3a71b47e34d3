"""``eval``: offline DFlash acceptance of a drafter against a target, on this host.

    python -m remote eval --spec job.json

Spec (`remote.protocol.EvalSpec` as a JSON object; unknown keys are an error, so a typo
never silently changes a run):

    target            path of the target model folder (HF layout, safetensors)      required
    drafter           path of the drafter folder or weights file                     required
    ground_truth      JSONL, lines {"id", "prompt_ids": [...], "completion_ids": [...]} required
                      (and the prompt's "category", "subcategory" where it has them:
                      carried into its sample record)
    output_dir        where result.json and samples.jsonl go                         required
    dtype             "bfloat16" (default) or "float32" ("bf16"/"fp32" accepted)
    threads           torch threads (default: torch's choice)
    budgets           DDTree node budgets to report side by side (default [])
    topk              per-depth candidates for DDTree (default null = the budget)
    max_samples       evaluate only the first N samples (default all)
    block_chunk       blocks per batched drafter call (default: sized to the memory the
                      attention scores may take, see remote.eval.drafts.auto_chunk)
    positions         "walk" (default): draft blocks only where the walks start rounds,
                      samples in lockstep (their blocks of a step in shared drafter
                      calls); per-position acceptance covers the chain walk's round
                      starts. "all": draft at every completion position too, so
                      per-position acceptance covers all of them; the same rounds

Every check that can fail on the inputs (paths, drafter vs target compatibility, token ids,
empty completions, memory) runs BEFORE any weights are loaded. Progress goes to stdout as JSON
lines: ``{"event": "start", ...}``, one ``{"event": "sample", "index": i, ..., "record":
{...}}`` per sample as its walks end, in any order (the record is its samples.jsonl line,
``i`` its place in the job's samples) and
``{"event": "done", "result": path, ...}``. Results are written atomically (temp + rename).
After the walk, one round's costs on this host (a target step, a verify, a drafter block:
`remote.eval.costs`) go into ``timings.round_costs``, for the controller's speedup estimate.
With the host's feature cache holding every sample's features and the target's costs, the
target is loaded without its decoder layers (`remote.eval.feature_cache`).
"""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Any

from remote.atomic import write_atomic
from remote.errors import UserError
from remote.eval.memory import estimate_bytes
from remote.probe.facts import meminfo, package_version
from remote.protocol import (
    RESULT_SCHEMA,
    TARGET_LOADED_ENDS,
    TARGET_LOADED_WHOLE,
    EvalSpec,
    ResultError,
    SpecError,
    completion_keys,
    sample_labels,
)
from remote.protocol import metrics as registry

SCHEMA = RESULT_SCHEMA


def read_spec(path: str) -> EvalSpec:
    """The validated spec with defaults filled in; the four paths are required."""
    try:
        with open(path) as fh:
            raw = json.load(fh)
    except OSError as exc:
        raise UserError(f"cannot read spec {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"spec {path} is not valid JSON (line {exc.lineno}): {exc.msg}") from None
    try:
        spec = EvalSpec.from_json(raw)
    except (SpecError, TypeError) as exc:
        raise UserError(f"spec {path}: {exc}") from None
    for key in ("target", "drafter", "ground_truth", "output_dir"):
        if not getattr(spec, key):
            raise UserError(f"spec needs {key!r} (a path)")
    return spec


def read_ground_truth(path: str, vocab: int, max_samples: int | None) -> list[dict[str, Any]]:
    """Samples from the JSONL file, each checked: non-empty prompt and completion, integer
    ids inside the target's vocabulary."""
    if not os.path.isfile(path):
        raise UserError(f"ground truth file {path} does not exist")
    rows = []
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                sid, prompt, completion = row.get("id", n), row["prompt_ids"], row["completion_ids"]
            except (json.JSONDecodeError, KeyError, AttributeError):
                raise UserError(
                    f'{path} line {n} is not {{"id", "prompt_ids", "completion_ids"}} JSON'
                ) from None
            for name, ids in (("prompt_ids", prompt), ("completion_ids", completion)):
                if not isinstance(ids, list) or not ids:
                    raise UserError(
                        f"{path} line {n} (id {sid}) has empty "
                        f"{name}; drop the sample or regenerate it"
                    )
                bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t < vocab), None)
                if bad is not None:
                    raise UserError(
                        f"{path} line {n} (id {sid}) has token id {bad!r} outside the target "
                        f"vocabulary (0..{vocab - 1}); was it made with another tokenizer?"
                    )
            try:
                labels = {**sample_labels(row), **completion_keys(row)}
            except (ResultError, SpecError) as exc:
                raise UserError(f"{path} line {n} (id {sid}): {exc}") from None
            rows.append({"id": sid, **labels, "prompt_ids": prompt, "completion_ids": completion})
            if max_samples and len(rows) >= max_samples:
                break
    if not rows:
        raise UserError(f"ground truth file {path} holds no samples")
    return rows


def check_compatible(dcfg, tinfo, fc_in: int | None) -> None:
    """Drafter vs target: layer ids in range, hidden width, vocabulary, mask id, fc width."""
    n = tinfo.num_layers
    bad = [i for i in dcfg.target_layer_ids if not 0 <= i < n]
    if bad:
        raise UserError(
            f"drafter target_layer_ids {bad} are outside the "
            f"target's {n} layers (0..{n - 1}); wrong target?"
        )
    if dcfg.hidden_size != tinfo.hidden_size:
        raise UserError(
            f"drafter hidden_size {dcfg.hidden_size} differs from "
            f"the target's {tinfo.hidden_size}; wrong target?"
        )
    if dcfg.vocab_size != tinfo.vocab_size:
        raise UserError(
            f"drafter vocab_size {dcfg.vocab_size} differs from "
            f"the target's {tinfo.vocab_size}; wrong target?"
        )
    if not 0 <= dcfg.mask_token_id < tinfo.vocab_size:
        raise UserError(
            f"drafter mask_token_id {dcfg.mask_token_id} is "
            f"outside the target vocabulary ({tinfo.vocab_size})"
        )
    want = len(dcfg.target_layer_ids) * dcfg.hidden_size
    if fc_in is not None and fc_in != want:
        raise UserError(
            f"drafter fc takes {fc_in} features but {len(dcfg.target_layer_ids)} "
            f"layers x hidden {dcfg.hidden_size} = {want}; fix target_layer_ids"
        )


def fc_width(path: str) -> int | None:
    """``fc`` input width of the drafter, read as `load_drafter` reads its weights (headers
    only for safetensors); None when the weights have no ``fc.weight``."""
    from remote.eval.drafter import normalise_key, weight_shapes

    keys, _problems = weight_shapes(path)
    for k, (_file, _dtype, shape) in keys.items():
        if normalise_key(k) == "fc.weight" and len(shape) == 2:
            return int(shape[1])
    return None


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

    from remote.eval import context_check, costs, feature_cache
    from remote.eval import device as device_mod
    from remote.eval import drafter as drafter_mod
    from remote.eval import target as target_mod
    from remote.eval.metrics import summarize
    from remote.eval.round_timing import SHARE, Capture
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
    need = estimate_bytes(tbytes, dcfg, max_len, itemsize, spec.block_chunk, spec.positions) - (
        0 if target is None else tbytes
    )
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
    done: dict[int, dict[str, Any]] = {}
    t_eval = time.perf_counter()
    samples = [(r["prompt_ids"], r["completion_ids"]) for r in rows]
    given = None
    if cache is not None:
        given = feature_cache.Features(cache, target, dcfg.target_layer_ids, samples, device)
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
            target, drafter, cost_inputs, cached_costs, cache, device, walked, SHARE * eval_s
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
    sample (`feature_cache.Features`, which loads the layers should that entry fail).
    `walked`: what the walk's forward over the costs' sample left (`round_timing.Capture`);
    `budget_s`: the seconds the timing may take."""
    from remote.eval import costs, feature_cache
    from remote.protocol import TARGET_COSTS

    context = None
    if not target.whole:
        row, layers = inputs.row, drafter.cfg.target_layer_ids
        given = feature_cache.Features(
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
    from remote.eval import feature_cache

    if features is None:
        return None
    context = feature_cache.run_context(attn, spec.target, dcfg.target_layer_ids, dtype, device)
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
