"""Offline beside online, cut the same way, per sample; pure (docs/online.md)."""

from __future__ import annotations

from typing import Any

from remote.online.diagnosis import diagnose
from remote.protocol import context
from remote.protocol.metrics import walk_stats

SCHEMA = "dflash.online-verdict/1"


def cut_rounds(accepted: list[int], total: int) -> tuple[list[int], int]:
    """Verify steps' rounds cut at ``total`` as the walk cuts, and their tokens."""
    rounds, s = [], 0
    for a in accepted:
        if s >= total:
            break
        n = min(a + 1, total - s)
        rounds.append(n)
        s += n
    return rounds, s


def position_acceptance(samples_rounds: list[list[int]], k: int) -> list[dict[str, Any]]:
    """Per draft position ``1..k``: attempts, accepted and rate over the walks' rounds."""
    att, hit = [0] * k, [0] * k
    for rounds in samples_rounds:
        left = sum(rounds)
        for n in rounds:
            for j in range(1, min(n - 1, k) + 1):
                att[j - 1] += 1
                hit[j - 1] += 1
            if n <= k and n < left:
                att[n - 1] += 1
            left -= n
    return [
        {
            "position": j + 1,
            "attempts": att[j],
            "accepted": hit[j],
            "rate": hit[j] / att[j] if att[j] else None,
        }
        for j in range(k)
    ]


def first_divergence(offline: list[int], online: list[int]) -> dict[str, Any] | None:
    """Where two walks first part: round, start token, both lengths; or None."""
    token = 1
    for i in range(max(len(offline), len(online))):
        a = offline[i] if i < len(offline) else None
        b = online[i] if i < len(online) else None
        if a != b:
            return {"round": i, "token": token, "offline": a, "online": b}
        token += a
    return None


def by_context(records: list[dict]) -> list[dict[str, Any]]:
    """Offline beside online per context bucket: rounds, tau, first divergences."""
    sums: dict[int, dict[str, Any]] = {}
    for rec in records:
        for side in ("offline", "online"):
            got = context.tau_parts({"prompt_tokens": rec["prompt_tokens"], "rounds": rec[side]}, 0)
            for b, (tokens, rounds) in got.items():
                row = sums.setdefault(b, {"context": b, "diverged": 0})
                row[f"{side}_tokens"] = row.get(f"{side}_tokens", 0) + tokens
                row[f"{side}_rounds"] = row.get(f"{side}_rounds", 0) + rounds
        if rec["divergence"] is not None:
            b = context.bucket(rec["divergence"])
            sums.setdefault(b, {"context": b, "diverged": 0})["diverged"] += 1
    out = []
    for b in sorted(sums):
        row = sums[b]
        for side in ("offline", "online"):
            n, t = row.pop(f"{side}_rounds", 0), row.pop(f"{side}_tokens", 0)
            row[f"{side}_rounds"], row[f"{side}_tau"] = n, (t / n if n else None)
        out.append(row)
    return out


def first_difference(truth: list[int], output: list[int]) -> int | None:
    """The first index where the output differs from the ground truth; None if equal."""
    for i, (a, b) in enumerate(zip(truth, output, strict=False)):
        if a != b:
            return i
    return None if len(truth) == len(output) else min(len(truth), len(output))


def compare(
    ground_truth: list[dict],
    offline: list[dict],
    online: list[dict],
    *,
    block_size: int,
    offline_dtype: str | None = None,
    online_dtype: str | None = None,
    invalid: list[dict] | None = None,
) -> dict[str, Any]:
    """The verdict by sample id; with `invalid` counts, no online tau."""
    off_by = {r["id"]: r for r in offline}
    on_by = {r["id"]: r for r in online}
    missing = [g["id"] for g in ground_truth if g["id"] not in off_by or g["id"] not in on_by]
    if missing:
        raise ValueError(f"samples {missing[:5]} lack an offline or an online record")
    ks = {r.get("num_spec_tokens") for r in online}
    if len(ks) != 1:
        raise ValueError(f"online records disagree on num_spec_tokens: {sorted(ks, key=str)}")
    k = ks.pop()
    detailed = not invalid and all(r.get("per_step_accepted") is not None for r in online)
    per_sample, off_rounds, on_rounds, placed = [], [], [], []
    uncut_steps = uncut_tokens = 0
    for g in ground_truth:
        sid, truth = g["id"], g["completion_ids"]
        total = len(truth) - 1
        off, on = off_by[sid]["rounds"], on_by[sid]
        wrong = first_difference(truth, on["token_ids"])
        row: dict[str, Any] = {"id": sid, "lossless": wrong is None, "first_wrong_token": wrong}
        if detailed:
            acc = on["per_step_accepted"]
            cut, covered = cut_rounds(acc, total)
            uncut_steps += len(acc)
            uncut_tokens += sum(a + 1 for a in acc)
            div = first_divergence(off, cut)
            prompt = len(g.get("prompt_ids") or [])
            if div is not None:
                div["context"] = prompt + div["token"] - 1
            placed.append(
                {
                    "prompt_tokens": prompt,
                    "offline": off,
                    "online": cut,
                    "divergence": div and div["context"],
                }
            )
            row.update(
                rounds_equal=div is None,
                first_divergence=div,
                covered=covered == total,
                offline_tau=sum(off) / len(off) if off else None,
                online_tau=sum(cut) / len(cut) if cut else None,
                online_rounds=cut,
            )
            on_rounds.append(cut)
        elif not invalid:
            steps = on.get("num_spec_steps") or sum(on.get("acceptance_histogram") or [])
            if steps and on.get("mean_acceptance_length") is not None:
                uncut_steps += steps
                uncut_tokens += on["mean_acceptance_length"] * steps
        off_rounds.append(off)
        per_sample.append(row)
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "samples": len(ground_truth),
        "block_size": block_size,
        "num_spec_tokens": k,
        "dtype": {"offline": offline_dtype, "online": online_dtype},
        "offline": walk_stats(off_rounds),
        "online": walk_stats(on_rounds) if detailed else None,
        "online_uncut_tau": uncut_tokens / uncut_steps if uncut_steps else None,
        "per_position": {
            "offline": position_acceptance(off_rounds, block_size - 1),
            "online": position_acceptance(on_rounds, k) if detailed and k else None,
        },
        "lossless": {
            "samples": sum(r["lossless"] for r in per_sample),
            "total": len(per_sample),
            "ok": all(r["lossless"] for r in per_sample),
        },
        "rounds_equal": {
            "samples": sum(r["rounds_equal"] for r in per_sample) if detailed else None,
            "total": len(per_sample),
        },
        "per_sample": per_sample,
        "invalid": list(invalid or []),
        "by_context": by_context(placed) if detailed else None,
    }
    return conclude(result)


def conclude(result: dict[str, Any]) -> dict[str, Any]:
    """`result` with its diagnosis and verdict (the first cause); again after each addition."""
    result["diagnosis"] = diagnose(result)
    result["verdict"] = result["diagnosis"][0]["cause"]
    return result


def disagreeing(result: dict[str, Any]) -> dict[Any, list[int]]:
    """The online rounds, by sample id, of the samples whose rounds differ."""
    return {
        r["id"]: r["online_rounds"] for r in result["per_sample"] if r.get("rounds_equal") is False
    }


def level(
    concurrency: int, measured: dict[str, Any], cut: dict[str, Any], first: dict | None
) -> dict[str, Any]:
    """One concurrency level's row, and how many samples repeat `first`'s rounds."""
    on = cut["online"] or {}
    same = None
    if first is not None and first["online"] is not None and cut["online"] is not None:
        pairs = zip(first["per_sample"], cut["per_sample"], strict=True)
        same = sum(a["online_rounds"] == b["online_rounds"] for a, b in pairs)
    seconds, tokens = measured["seconds"], measured["tokens"]
    return {
        "concurrency": concurrency,
        "seconds": seconds,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds if seconds > 0 else None,
        "tau_token_weighted": on.get("tau_token_weighted"),
        "tau_per_sample_mean": on.get("tau_per_sample_mean"),
        "rounds_equal": cut["rounds_equal"]["samples"],
        "same_rounds_as_first": same,
        "lossless": cut["lossless"]["samples"],
        "counters_agree": measured.get("counters_agree"),
        "invalid": bool(measured.get("invalid")),
    }


def engine_costs(
    decode: dict[str, Any] | None, rows: list[dict], counters: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Decode time per output token and verify step; None without the histogram."""
    if not decode or decode.get("requests") != len(rows):
        return None
    seconds = decode["seconds"]
    tokens = sum(max(len(r["completion_ids"]) - 1, 0) for r in rows)
    steps = (counters or {}).get("drafts") or None
    return {
        "source": decode.get("source"),
        "decode_s": seconds,
        "decode_tokens": tokens,
        "verify_steps": steps,
        "time_per_output_token_s": seconds / tokens if tokens else None,
        "time_per_verify_step_s": seconds / steps if steps else None,
        "tokens_per_verify_step": tokens / steps if steps else None,
    }
