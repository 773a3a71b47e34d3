"""Before ``dflash parity`` captures: both hosts' preflights at once, their targets compared."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from orchestrator.errors import DflashError, RemoteCommandError
from orchestrator.eval import job as remote_job
from orchestrator.eval.parity.options import ParityOptions
from orchestrator.transport.hosts import Host


def target_difference(a: dict | None, b: dict | None) -> str | None:
    """How two preflight target identities differ, in a phrase; None if alike."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None

    def part(x: dict, key: str) -> dict:
        v = x.get(key)
        return v if isinstance(v, dict) else {}

    def word(v: object) -> str:
        return " ".join(str(v).split())

    def shape(x: dict) -> str:
        t = part(x, "text")
        return word(
            f"{x.get('architecture')} ({t.get('num_layers')} layers, hidden "
            f"{t.get('hidden_size')}, vocab {t.get('vocab_size')})"
        )

    ca, cb = part(a, "config"), part(b, "config")
    keys = sorted(word(k) for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
    wa, wb = part(a, "weights"), part(b, "weights")
    if not keys and wa.get("sha256") == wb.get("sha256"):
        return None
    what = [f"A has {shape(a)}, B {shape(b)}"]
    if keys:
        what.append(
            f"their text configs differ in {', '.join(keys[:5])}"
            + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
        )
    if wa.get("sha256") != wb.get("sha256"):
        what.append(
            f"their text weights differ in names or shapes ({word(wa.get('tensors'))} "
            f"tensors on A, {word(wb.get('tensors'))} on B)"
        )
    return "; ".join(what)


def check_hosts(a: Host, job_a: dict, b: Host, job_b: dict, opts: ParityOptions) -> dict:
    """Both hosts' capture preflights, targets compared; the first problem names its host."""
    with ThreadPoolExecutor(2, thread_name_prefix="parity-preflight") as pool:
        futures = {
            "a": pool.submit(remote_job.preflight, a, job_a),
            "b": pool.submit(remote_job.preflight, b, job_b),
        }
        reports = {side: f.result() for side, f in futures.items()}
    for host, report in ((a, reports["a"]), (b, reports["b"])):
        if not isinstance(report, dict):
            raise RemoteCommandError(
                f"{host.name}: preflight answered {type(report).__name__}, not a JSON object"
            )
    diff = target_difference(
        reports["a"].get("target_identity"), reports["b"].get("target_identity")
    )
    if diff and not opts.allow_different_targets:
        raise DflashError(
            f"the targets on {a.name} and {b.name} are not the same checkpoint: {diff}; "
            "parity compares one model's numerics on two hosts: point --model-a/--model-b "
            "at copies of one checkpoint, or pass --allow-different-targets to compare anyway"
        )
    return reports
