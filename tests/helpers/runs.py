"""Run folders as an eval leaves them, without running one: the records of a seeded walk,
summarised by the engine's own `remote.eval.metrics.summarize`, written in the shapes of
`remote.eval.engine` (``result.json``), `remote.eval.job.annotate_result` (its inputs) and
`orchestrator.eval.spec.build_spec` (``spec.json``). For tests of what the controller
shows and exports; the tests that run real evals check that real results have these
types (`remote.protocol.check_result`)."""

from __future__ import annotations

import hashlib
import json
import random
import zlib
from pathlib import Path

from remote.eval.metrics import summarize
from remote.protocol import JOB_SPEC_SCHEMA, RESULT_SCHEMA

BLOCK = 4
BUDGETS = (2, 4)


def records(
    samples: int,
    skill: float,
    seed: int,
    contexts: tuple[int, ...] = (),
    context_skill=None,
) -> list[dict]:
    """Per-sample records of a drafter that accepts each draft position with probability
    `skill`: rounds, per-position attempts and hits, agreement, DDTree rounds. `contexts`:
    the samples' prompt lengths in turn (default ``10 + i``); `context_skill(prompt
    tokens)`: the skill at that context, instead of `skill`."""
    rng = random.Random(seed)
    out = []
    for i in range(samples):
        completion = 12 + i  # the ground truth's length: the same whoever drafts
        prompt = contexts[i % len(contexts)] if contexts else 10 + i
        if context_skill is not None:
            skill = context_skill(prompt)
        rounds, att, hit = [], [0] * (BLOCK - 1), [0] * (BLOCK - 1)
        while sum(rounds) < completion:
            n = 1
            for j in range(min(BLOCK, completion - sum(rounds)) - 1):
                att[j] += 1
                if rng.random() >= skill:
                    break
                hit[j] += 1
                n += 1
            rounds.append(n)
        out.append(
            {
                "id": f"s{i}",
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "rounds": rounds,
                "tau": sum(rounds) / len(rounds),
                "position_attempts": att,
                "position_hits": hit,
                "agreement": {"match": 9, "total": 10},
                "ddtree": {str(b): [min(BLOCK, r + 1) for r in rounds] for b in BUDGETS},
            }
        )
    return out


def make_run(
    root: Path,
    run_id: str,
    checkpoint: str,
    step: int | None,
    *,
    skill: float = 0.5,
    created: float = 1.75e9,
    samples: int = 4,
    host: str = "evalbox",
    trainer_folder: str = "/data/team-run/checkpoints",
    categories: tuple[str, ...] = (),
    thinking: bool | None = None,
    chat_template: str | None = None,
    contexts: tuple[int, ...] = (),
    context_skill=None,
) -> Path:
    """One run folder ``root/run_id`` for `checkpoint` at training `step`; returns it.
    `categories`: the samples' categories, in turn (sample i gets ``categories[i % n]``);
    `thinking`, `chat_template`: the thinking flag of its job spec and the chat template's
    sha256 its ground truth recorded (None: not recorded, as in older results); `contexts`,
    `context_skill`: the samples' prompt lengths and the skill at each (`records`)."""
    seed = zlib.crc32(f"{checkpoint}/{step}".encode("utf-8", "surrogatepass"))
    recs = records(samples, skill, seed, contexts, context_skill)
    for i, rec in enumerate(recs):
        if categories:
            rec["category"] = categories[i % len(categories)]
    folder = root / run_id
    folder.mkdir(parents=True)
    metrics = summarize(recs, BLOCK, list(BUDGETS), None, 64)
    identity = {
        "sha256": hashlib.sha256(checkpoint.encode("utf-8", "surrogatepass")).hexdigest(),
        "step": step,
        "step_from": "relay manifest",
        "hashed_by": "relay manifest",
        "source": {"host": "trainer", "path": f"{trainer_folder}/{checkpoint}"},
    }
    result = {
        "schema": RESULT_SCHEMA,
        "inputs": {
            "target": "/models/target",
            "drafter": f"/drafters/{checkpoint}",
            "samples": samples,
            "dtype": "float32",
            "target_architecture": "Qwen3ForCausalLM",
            "target_layers": 2,
            "target_vocab_size": 64,
            "checkpoint": checkpoint,
            "prompts": {"name": "chat", "sha256": "a" * 64},
            "drafter_identity": identity,
            "target_identity": {"config_sha256": "c" * 64, "weights": [["model.safetensors", 9]]},
            "ground_truth_sha256": "b" * 64,
            "eval_engine": {"name": "dflash offline walk (remote.eval.engine)"},
        },
        "environment": {"dtype": "float32", "python": "3.11", "cpus": 2, "threads": 1},
        "metrics": metrics,
        "timings": {"eval_s": 1.5, "total_s": 2.0, "tokens": 99, "tokens_per_s": 66.0},
        "samples_file": "samples.jsonl",
        "job": {"job_id": run_id, "host": host, "created": created},
    }
    spec = {
        "schema": JOB_SPEC_SCHEMA,
        "kind": "eval",
        "created": created,
        "host": host,
        "checkpoint": checkpoint,
        "prompts": {"name": "chat", "sha256": "a" * 64},
    }
    if thinking is not None:
        spec["thinking"] = thinking
    gt = {"kind": "sglang", "url": "http://127.0.0.1:1/", "cached": False}
    if chat_template is not None:
        gt["chat_template_sha256"] = chat_template
    (folder / "result.json").write_text(json.dumps(result, indent=2))
    (folder / "spec.json").write_text(json.dumps(spec, indent=2))
    (folder / "ground_truth.json").write_text(json.dumps(gt, indent=2))
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return folder


def edit_result(folder: Path, change) -> None:
    """Rewrite ``folder/result.json`` through `change(doc)` (which edits it in place)."""
    path = folder / "result.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=2))
