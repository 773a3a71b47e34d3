"""How a run was made, as its folder records it: dtype, thinking mode, chat template,
engine, the target's features; the settings that move tau (`SETTINGS`) and how they
differ from another run of the same checkpoint in the results folder (`beside`), so two
taus of one drafter are never read side by side without what sets them apart."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.printable import printable
from orchestrator.results import store as res
from remote.protocol import GT_SOURCES, JOB_EVAL_KEY
from remote.protocol import metrics as registry


def _part(run: res.Run, key: str) -> dict:
    value = run.spec.get(key)  # spec.json is a host's word: any JSON
    return value if isinstance(value, dict) else {}


def target_features(run: res.Run) -> dict:
    """Where the run's target features came from (``inputs.target_features``: the host's
    cache or the target's forward); {} for a run that does not say."""
    got = (run.result.get("inputs") or {}).get("target_features")
    return got if isinstance(got, dict) else {}


def window_warnings(run: res.Run) -> list[str]:
    """The drafter's window check the engine recorded (``inputs.drafter_window``: the run's
    longest context past the drafter's window), as its one warning line; [] otherwise."""
    got = (run.result.get("inputs") or {}).get("drafter_window")
    line = got.get("warning") if isinstance(got, dict) else None
    return [line] if isinstance(line, str) else []


def context_ladder(run: res.Run) -> list[int] | None:
    """The rungs of the context ladder the run's prompts were put at (its job's
    ``context_ladder``); None for prompts as they were."""
    rungs = run.spec.get("context_ladder")
    return rungs if isinstance(rungs, list) else None


def dtype(run: res.Run) -> Any:
    return (run.result.get("environment") or {}).get("dtype") or run.spec.get("dtype")


def thinking(run: res.Run) -> str | None:
    """``on`` or ``off``: whether the prompts were rendered with thinking on (the job's
    flag, else the one its ground truth recorded); None when neither says."""
    for doc in (run.spec, res.ground_truth_source(run)):
        if isinstance(doc.get("thinking"), bool):
            return "on" if doc["thinking"] else "off"
    return None


def sampling(run: res.Run) -> str:
    """``greedy``, or the temperature (top-k, top-p) and draft policy tau was computed
    at (docs/dflash-eval.md): runs at different ones are different evals."""
    given = {**_part(run, "sampling"), **_part(run, JOB_EVAL_KEY)}
    t = given.get("temperature") or 0
    if not t:
        return "greedy"
    knobs = [f"temperature {t:g}"]
    knobs += [f"{k.replace('_', '-')} {given[k]}" for k in ("top_k", "top_p") if given.get(k)]
    return f"{', '.join(knobs)}, {given.get('draft_policy') or 'argmax'} drafts"


def chat_template(run: res.Run) -> str | None:
    """sha256 of the chat template the prompts were rendered with (the ground truth
    records it); None when there was none or it was not recorded."""
    return res.ground_truth_source(run).get("chat_template_sha256")


def engine(run: res.Run) -> str | None:
    """The eval engine that produced the result (the job records it in inputs.eval_engine)."""
    e = (run.result.get("inputs") or {}).get("eval_engine")
    if isinstance(e, dict):
        return e.get("name")
    return e or (run.result.get("environment") or {}).get("engine")


def _ground_truth(run: res.Run) -> str | None:
    gt = res.ground_truth_source(run)
    named = getattr(GT_SOURCES.get(str(gt.get("kind"))), "needs", None) == "path"
    where = gt.get("url") or (gt.get("path") if named else None)
    return " ".join(str(v) for v in (gt.get("kind"), where) if v) or None


def _budgets(run: res.Run) -> str | None:
    given = _part(run, JOB_EVAL_KEY).get("budgets")
    if not isinstance(given, list):
        given = sorted(run.metrics.get("ddtree") or {}, key=lambda b: (len(str(b)), str(b)))
    return ",".join(map(str, given)) or "none"


def _target(run: res.Run) -> str | None:
    """The target by its config's sha256 where recorded (a path differs between hosts)."""
    inputs = run.result.get("inputs") or {}
    sha = (inputs.get("target_identity") or {}).get("config_sha256")
    return f"config {sha[:12]}" if isinstance(sha, str) and sha else inputs.get("target")


# The settings that move tau, each read from the run folder (None: not recorded).
SETTINGS: tuple[tuple[str, Callable[[res.Run], Any]], ...] = (
    ("samples", lambda run: run.metrics.get("samples")),
    ("prompts", lambda run: (run.spec.get("prompts") or {}).get("name")),
    ("context ladder", context_ladder),
    ("max tokens", lambda run: _part(run, "sampling").get("max_new_tokens")),
    ("dtype", dtype),
    ("ground truth", _ground_truth),
    ("budgets", _budgets),
    ("thinking", thinking),
    ("sampling", sampling),
    ("positions", lambda run: _part(run, JOB_EVAL_KEY).get("positions")),
    ("target", lambda run: _target(run)),
)


def of_run(run: res.Run) -> dict[str, Any]:
    return {name: get(run) for name, get in SETTINGS}


def differences(a: res.Run, b: res.Run) -> list[dict]:
    """``{setting, this, other}`` for each setting `a` and `b` both record differently."""
    sa, sb = of_run(a), of_run(b)
    return [
        {"setting": k, "this": sa[k], "other": sb[k]}
        for k in sa
        if sa[k] is not None and sb[k] is not None and str(sa[k]) != str(sb[k])
    ]


def same_checkpoint(a: res.Run, b: res.Run) -> bool:
    """The same drafter: by its sha256 where both recorded one, else by name and
    training run."""
    if a.drafter.get("sha256") and b.drafter.get("sha256"):
        return a.drafter["sha256"] == b.drafter["sha256"]
    return (a.checkpoint, a.training_run) == (b.checkpoint, b.training_run)


def beside(run: res.Run, root: str | Path | None = None) -> dict | None:
    """The latest other run of `run`'s checkpoint in the results folder (`root`, else the
    run's own folder's), its headline metric and how the settings differ (this run's
    first); None when there is none."""
    others = [
        r
        for r in res.scan_runs(Path(root) if root else run.path.parent)[0]
        if r.run_id != run.run_id and same_checkpoint(run, r)
    ]
    if not others:
        return None
    other = max(others, key=lambda r: (r.created, r.run_id))
    head = registry.headline()
    return {
        "run_id": other.run_id,
        head.name: head.read(other.metrics),
        "differences": differences(run, other),
    }


def beside_line(run: res.Run, found: dict) -> str:
    """`beside` in one line: which run, both headlines, each setting that differs."""
    head = registry.headline()
    taus = (
        f"{head.header} {head.text(found[head.name])} there, "
        f"{head.text(head.read(run.metrics))} here"
    )
    if not found["differences"]:
        return printable(
            f"same settings as {found['run_id']}, this checkpoint's other run ({taus})"
        )
    said = ", ".join(f"{d['setting']} {d['this']} vs {d['other']}" for d in found["differences"])
    return printable(
        f"settings differ from {found['run_id']}, this checkpoint's other run ({taus}); "
        f"here vs there: {said}"
    )
