"""A job's prompts as a source completes them (`Prompts`: rendered for the target, the
cache entry they make, each completion checked) and the answers taken in prompt order,
every one checked before anything is cached (`collect`)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote.atomic import write_atomic, write_json_atomic
from remote.errors import UserError
from remote.eval.groundtruth.cache import Emit, cache_key, evict, jsonl, read_cache, target_identity
from remote.eval.groundtruth.checks import (
    check_completion,
    retokenisation_check,
    target_vocab_size,
)
from remote.eval.groundtruth.prompts import (
    chat_template_sha256,
    labelled,
    load_prompts,
    load_tokenizer,
    render_prompt,
)
from remote.httpclient import Waits
from remote.protocol import (
    EvalSpec,
    JobSpec,
    completion_id,
    completion_keys,
    request_seed,
    sample_labels,
    token_ids_only,
)

# What a cache entry's meta keeps of the phase's info (and the target's identity).
META_KEYS = (
    "kind",
    "url",
    "model",
    "sampling",
    "thinking",
    "samples",
    "warnings",
    "retokenisation",
    "generated",
    "source",
)


def require_source(job: JobSpec) -> None:
    """Refuse a job whose kind needs a source it does not name (`missing_source`)."""
    problem = job.ground_truth.missing_source()
    if problem:
        raise UserError(problem)


def job_info(job: JobSpec) -> dict[str, Any]:
    """The phase's record as it begins: where from, how decoded."""
    gt = job.ground_truth
    return {
        "kind": gt.kind,
        "url": gt.url,
        "path": gt.path,
        "sampling": job.sampling.to_json(),
        "warnings": [],
    }


@dataclass
class Prompts:
    """A job's prompts as a source completes them: `records` (id, text) and `rendered`
    (text, ids) with the target's chat template (prompts given as token ids: as they are,
    no text), one of each per completion to make (`expand`: several per prompt when the
    ground truth is sampled); the target's `tokenizer` (None when every prompt is token
    ids), `vocab` and `identity`; once `open_entry` named them, the `source` that answers,
    `where` (its words in an error), whether it answers in `text`, and the cache entry they
    make (`path`, its meta beside it); `info`, the phase's record so far."""

    job: JobSpec
    engine: EvalSpec
    records: list[dict]
    rendered: list[tuple[str, list[int]]]
    tokenizer: Any
    vocab: int
    identity: dict
    info: dict[str, Any]
    source: dict = field(default_factory=dict)
    where: str = ""
    path: Path = Path()
    started: float = 0.0
    text: bool = False

    @classmethod
    def of(cls, job: JobSpec, engine: EvalSpec) -> Prompts:
        """The job's prompts, rendered for its target, one per completion to make."""
        if not job.prompts:
            raise UserError("the job names no prompts file (its prompts.path)")
        records = load_prompts(job.prompts, job.samples, job.seed, job.prompts_sha256)
        tokenizer = None if token_ids_only(records) else load_tokenizer(engine.target)
        rendered = [
            ("", p["ids"]) if "ids" in p else render_prompt(tokenizer, p, job.thinking)
            for p in records
        ]
        vocab = target_vocab_size(engine.target, tokenizer)
        for p in records:  # ids given, not tokenised here: another tokenizer's would pass
            bad = next((t for t in p.get("ids") or [] if t >= vocab), None)
            if bad is not None:
                raise UserError(
                    f"prompt {p['id']} of {job.prompts} holds token id {bad}, outside the "
                    f"target's vocabulary (0..{vocab - 1}): give ids of {engine.target}'s "
                    "tokenizer"
                )
        records, rendered = expand(records, rendered, job.sampling)
        identity = target_identity(engine.target)
        return cls(job, engine, records, rendered, tokenizer, vocab, identity, job_info(job))

    def open_entry(self, source: dict, where: str, text: bool = False) -> Prompts:
        """Name the `source` that completes the prompts (`text`: in text, retokenised
        here) and the cache entry that makes (dropped first when the job asks for a
        ``fresh`` one); itself."""
        self.source, self.where, self.text = source, where, text
        # The labels are in the entry (its lines carry them): another labelling, another
        # entry.
        labels = [sample_labels(p) for p in self.records]
        key = cache_key(self.identity, self.ids, self.sampling, source["kind"], source, labels)
        cache_dir = Path(os.path.expanduser(self.job.workdir)) / "groundtruth"
        cache_dir.mkdir(parents=True, exist_ok=True)
        self.path = cache_dir / f"{key}.jsonl"
        self.info.update(model=source.get("model"), cache_key=key, file=str(self.path))
        self.info.update(
            thinking=self.job.thinking,
            chat_template_sha256=chat_template_sha256(self.tokenizer),
            samples=len(self.records),
        )
        if self.job.ground_truth.fresh:  # asked for: whatever the entry holds, it is remade
            evict(self.path)
            self.info["fresh"] = True
        return self

    @property
    def sampling(self) -> dict:
        return self.info["sampling"]

    def requests(self) -> list[dict]:
        """Each completion's own sampling settings (`Sampling.to_json` as the job has
        them): sampled, with its seed (`request_seed`) instead of the job's and without
        the count per prompt; greedy, the job's as they are."""
        base = self.sampling
        if not base["temperature"]:
            return [base] * len(self.records)
        each = {k: v for k, v in base.items() if k not in ("seed", "completions")}
        return [
            {**each, "seed": request_seed(base["seed"], r["prompt_id"], r["index"])}
            for r in self.records
        ]

    @property
    def ids(self) -> list[list[int]]:
        return [ids for _, ids in self.rendered]

    def check(self, ids: Any, prompt_id: str) -> list[int]:
        """`ids` if they can be the target's completion of prompt `prompt_id`
        (`check_completion`); retokenised text may take more ids than the server made."""
        limit = None if self.text else self.sampling["max_new_tokens"]
        return check_completion(
            ids,
            vocab=self.vocab,
            max_new=limit,
            prompt_id=prompt_id,
            source=self.where,
            target=self.engine.target,
        )

    def warn(self, message: str, emit: Emit) -> None:
        self.info["warnings"].append(message)
        emit("warning", message=message)

    def cached(self, emit: Emit) -> tuple[str, dict] | None:
        """The cache entry, when it is there and passes every check again; else None."""
        meta_path = self.path.with_suffix(".json")
        hit = None
        if self.path.is_file() and meta_path.is_file():
            hit = read_cache(self.path, meta_path, self.ids, self.check)
        if hit is None:
            return None
        meta = hit[1]
        self.info.update(
            cached=True,
            warnings=meta.get("warnings", []),
            retokenisation=meta.get("retokenisation"),
            generated=meta.get("generated"),
            source=meta.get("source") or {**self.source, "made": meta.get("generated")},
        )
        for w in self.info["warnings"]:
            emit("warning", message=w)
        total = len(self.records)
        emit("ground_truth", done=total, total=total, cached=True)
        return str(self.path), self.info

    def store(self, records: list[dict]) -> tuple[str, dict]:
        """Write the checked `records` as the cache entry, with its meta; (its path, info)."""
        generated = time.time()
        self.info.update(
            cached=False,
            generated=generated,
            seconds=round(generated - self.started, 3),
            source={**self.source, "made": generated},
        )
        write_atomic(self.path, jsonl(records))
        meta = {k: self.info[k] for k in META_KEYS if k in self.info}
        meta["target"] = self.identity
        write_json_atomic(self.path.with_suffix(".json"), meta)
        return str(self.path), self.info


def expand(records: list[dict], rendered: list, sampling) -> tuple[list, list]:
    """(records, rendered) with one entry per completion: greedy, as they are; sampled,
    `sampling.completions` of each prompt, their ids naming the prompt and the
    completion's index (`completion_id`; ``prompt_id`` and ``index`` beside it)."""
    if not sampling.sampled:
        return records, rendered
    out_records, out_rendered = [], []
    for rec, ren in zip(records, rendered, strict=True):
        for k in range(sampling.completions):
            pid = rec["id"]
            out_records.append({**rec, "id": completion_id(pid, k), "prompt_id": pid, "index": k})
            out_rendered.append(ren)
    return out_records, out_rendered


@contextmanager
def _aborting(waits: Waits) -> Iterator[None]:
    """Inside, a failure ends every request still in flight before it is raised."""
    try:
        yield
    except BaseException:
        waits.abort()
        raise


def collect(prompts: Prompts, answers: Iterable[Any], waits: Waits, emit: Emit) -> list[dict]:
    """The records of `answers` (one per prompt, in prompt order), each completion checked
    as it arrives and all before the cache is written: a bad answer is refused here and
    never reused by a later run. `answers` is closed on the way out, also when a check
    refuses one: no more requests go out, and those in flight are ended (`Waits.abort`)."""
    prompts.started = time.time()
    records, mismatched, total = [], 0, len(prompts.records)
    with closing(iter(answers)) as answers_in_order, _aborting(waits):
        for i, (prompt, (text, ids), answer) in enumerate(
            zip(prompts.records, prompts.rendered, answers_in_order, strict=False)
        ):
            completion = answer
            if prompts.text:
                ctext, count = answer
                completion = list(prompts.tokenizer(ctext, add_special_tokens=False)["input_ids"])
                if not retokenisation_check(prompts.tokenizer, text, ids, ctext, completion, count):
                    mismatched += 1
            prompts.check(completion, prompt["id"])
            line = {**labelled(prompt), **completion_keys(prompt)}
            records.append({**line, "prompt_ids": ids, "completion_ids": completion})
            emit("ground_truth", done=i + 1, total=total, cached=False, tokens=len(completion))
    if prompts.text:
        _retokenisation(prompts, len(records), mismatched, emit)
    return records


def _retokenisation(prompts: Prompts, samples: int, mismatched: int, emit: Emit) -> None:
    """Record how many retokenised completions failed `retokenisation_check` (a warning
    when any did)."""
    prompts.info["retokenisation"] = {
        "samples": samples,
        "mismatched": mismatched,
        "mismatch_rate": mismatched / samples,
        "check": "no U+FFFD in the text, server's token count matches, ids decode to the "
        "text, prompt+completion encodes to prompt ids + completion ids; a lower "
        "bound: compare the target agreement rate",
    }
    if mismatched:
        prompts.warn(
            f"retokenisation mismatch in {mismatched} of {samples} samples "
            f"({mismatched / samples:.0%}): their ground-truth ids may differ "
            "from what the server generated",
            emit,
        )
