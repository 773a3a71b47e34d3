"""The ground-truth phase of a job (`prepare`): read the job once
(`remote.eval.preflight.read_job`), then one
function per source kind: a host's file (`from_file`), a serving engine (`from_server`), the
target itself (`from_local`). Both of the last two make completions of the job's rendered
prompts (`Prompts`), reuse a cache entry that still passes every check, and check every
completion before anything is cached (`collect`, `store`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote.atomic import write_atomic, write_json_atomic
from remote.errors import UserError
from remote.eval.groundtruth.cache import Emit, cache_key, evict, jsonl, read_cache, target_identity
from remote.eval.groundtruth.checks import (
    check_completion,
    read_ground_truth_file,
    retokenisation_check,
    target_vocab_size,
)
from remote.eval.groundtruth.local import LocalGenerator
from remote.eval.groundtruth.prompts import (
    chat_template_sha256,
    labelled,
    load_prompts,
    load_tokenizer,
    render_prompt,
    select,
)
from remote.eval.groundtruth.servers import (
    endpoint,
    in_order,
    openai_completion_ids,
    openai_completion_text,
    served_model,
    sglang_generate,
)
from remote.eval.preflight import read_job
from remote.httpclient import Waits, reachable
from remote.protocol import SERVER_KINDS, EvalSpec, JobSpec, sample_labels

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


def prepare(
    spec: dict | JobSpec,
    emit: Emit = lambda *a, **k: None,
    engine: EvalSpec | None = None,
    load_model: Callable[[], Any] | None = None,
    asking: Callable[[], None] | None = None,
) -> tuple[str, dict]:
    """Make (or reuse) the ground truth the job asks for. The target (its tokenizer, and for
    kind ``local`` its dtype and threads) is the job's EvalSpec's (``eval``); `spec`: the
    job document, or the `JobSpec` the caller read from it; `engine`: the job's EvalSpec
    when the caller has read it already. `load_model`: gives the target's loaded model
    for local generation (called only when generation is needed), so a job that evaluates
    next loads it once; without it local generation loads its own. `asking`: called when
    a server is about to be asked for completions (not when the cache holds them), so a
    job can load its target while the server answers.

    Returns (path of a JSONL file of ``{"id", "prompt_ids", "completion_ids"}``, info for
    the result: kind, url, model, cache key, ``cached`` (whether it came from the cache),
    ``source`` (kind, url, model, model_root, ``made``: when it was generated), warnings,
    retokenisation). A server is asked which model it serves before the cache is looked
    at; every completion is checked before anything is written. ``ground_truth.fresh``:
    the cache entry is dropped and made again. Every wait is bounded
    (`remote.protocol.GTLimits`: ``timeout``, ``deadline``, ``phase_deadline``, from
    this call on).
    """
    began = time.monotonic()
    job = read_job(spec)
    waits = Waits(job.ground_truth.limits, started=began)
    if job.ground_truth.kind == "file":
        return from_file(job, emit)
    if job.ground_truth.kind in SERVER_KINDS:
        return from_server(job, engine or job.engine, waits, emit, asking)
    return from_local(job, engine or job.engine, waits, emit, load_model)


def _require_source(job: JobSpec) -> None:
    """Refuse a job whose kind needs a source it does not name (`missing_source`)."""
    problem = job.ground_truth.missing_source()
    if problem:
        raise UserError(problem)


def _info(job: JobSpec) -> dict[str, Any]:
    gt = job.ground_truth
    return {
        "kind": gt.kind,
        "url": gt.url,
        "path": gt.path,
        "sampling": job.sampling.to_json(),
        "warnings": [],
    }


def from_file(job: JobSpec, emit: Emit) -> tuple[str, dict]:
    """Kind ``file``: the job's selection of a ground-truth file on this host, each record
    checked, written to the job's own folder (it belongs to this job, not to the cache)."""
    gt = job.ground_truth
    _require_source(job)
    records = select(read_ground_truth_file(gt.path), job.samples, job.seed)
    out = Path(os.path.expanduser(job.workdir)) / "jobs" / (job.job_id or "adhoc")
    out = out / "ground_truth.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, jsonl(records))
    info = _info(job)
    info.update(
        cached=False,
        samples=len(records),
        file=str(out),
        source={"kind": "file", "path": gt.path, "made": time.time()},
    )
    emit("ground_truth", done=len(records), total=len(records), cached=False)
    return str(out), info


def from_server(
    job: JobSpec,
    engine: EvalSpec,
    waits: Waits,
    emit: Emit,
    asking: Callable[[], None] | None = None,
) -> tuple[str, dict]:
    """Kinds ``sglang``, ``openai``, ``openai-text``: the server is reached and asked what
    it serves (who answers is part of what the ground truth is: another URL or served
    model is another cache entry), then, unless the cache holds the entry, asked for each
    prompt's completion, up to ``concurrency`` requests in flight (`asking` called
    first)."""
    gt = job.ground_truth
    prompts = Prompts.of(job, engine)
    _require_source(job)
    problem = reachable(gt.url, min(waits.limits.timeout, 10.0))
    if problem:
        raise UserError(problem)
    source = {
        "kind": gt.kind,
        "url": endpoint(gt.url, gt.kind),
        **served_model(gt.kind, gt.url, gt.model, waits),
    }
    where = f"server {source['url']}" + (f" ({source['model']})" if source["model"] else "")
    hit = prompts.open_entry(source, where).cached(emit)
    if hit is not None:
        return hit
    if asking is not None:
        asking()
    if gt.kind == "openai-text":
        prompts.warn(
            f"ground truth from a TEXT-only server ({gt.url}): completions are "
            "retokenised with the target's tokenizer, which does not always give the "
            "ids the server generated; see the retokenisation mismatch rate",
            emit,
        )
    sampling, model = prompts.sampling, source.get("model")

    def ask(text: str, ids: list[int]) -> Any:
        # Only the request runs in the pool: tokenising, checking and emitting stay on the
        # phase's thread, in prompt order.
        if gt.kind == "sglang":
            return sglang_generate(gt.url, ids, sampling, waits)
        if gt.kind == "openai":
            return openai_completion_ids(gt.url, model, ids, sampling, waits)
        return openai_completion_text(gt.url, model, text, sampling, waits, len(ids))

    return prompts.store(
        collect(prompts, in_order(ask, prompts.rendered, gt.concurrency), waits, emit)
    )


def from_local(
    job: JobSpec,
    engine: EvalSpec,
    waits: Waits,
    emit: Emit,
    load_model: Callable[[], Any] | None = None,
) -> tuple[str, dict]:
    """Kind ``local``: the target on this host completes the prompts greedily, unless the
    cache holds them; ``concurrency`` prompts per ``generate`` call, as a server batches
    them. `load_model`: the job's loaded target (else the generator loads its own)."""
    prompts = Prompts.of(job, engine)
    source = {"kind": "local", "url": None, "model": prompts.identity["path"]}
    hit = prompts.open_entry(source, f"local generation with {engine.target}").cached(emit)
    if hit is not None:
        return hit
    generator = LocalGenerator(
        engine.target, engine.dtype, engine.threads, model=load_model() if load_model else None
    )
    answers = generator.in_order(prompts.ids, prompts.sampling, job.ground_truth.concurrency, waits)
    return prompts.store(collect(prompts, answers, waits, emit))


@dataclass
class Prompts:
    """A job's prompts as a source completes them: `records` (id, text) and `rendered`
    (text, ids) with the target's chat template; the target's `tokenizer`, `vocab` and
    `identity`; once `open_entry` named them, the `source` that answers, `where` (its words
    in an error) and the cache entry they make (`path`, its meta beside it); `info`, the
    phase's record so far."""

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

    @classmethod
    def of(cls, job: JobSpec, engine: EvalSpec) -> Prompts:
        """The job's prompts, rendered for its target."""
        tokenizer = load_tokenizer(engine.target)
        if not job.prompts:
            raise UserError("the job names no prompts file (its prompts.path)")
        records = load_prompts(job.prompts, job.samples, job.seed, job.prompts_sha256)
        rendered = [render_prompt(tokenizer, p["text"], job.thinking) for p in records]
        identity = target_identity(engine.target)
        vocab = target_vocab_size(engine.target, tokenizer)
        return cls(job, engine, records, rendered, tokenizer, vocab, identity, _info(job))

    def open_entry(self, source: dict, where: str) -> Prompts:
        """Name the `source` that completes the prompts and the cache entry that makes
        (dropped first when the job asks for a ``fresh`` one); itself."""
        self.source, self.where = source, where
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

    @property
    def ids(self) -> list[list[int]]:
        return [ids for _, ids in self.rendered]

    def check(self, ids: Any, prompt_id: str) -> list[int]:
        """`ids` if they can be the target's completion of prompt `prompt_id`
        (`check_completion`); retokenised text may take more ids than the server made."""
        limit = None if self.source["kind"] == "openai-text" else self.sampling["max_new_tokens"]
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
    text_only = prompts.source["kind"] == "openai-text"
    records, mismatched, total = [], 0, len(prompts.records)
    with closing(iter(answers)) as answers_in_order, _aborting(waits):
        for i, (prompt, (text, ids), answer) in enumerate(
            zip(prompts.records, prompts.rendered, answers_in_order, strict=False)
        ):
            completion = answer
            if text_only:
                ctext, count = answer
                completion = list(prompts.tokenizer(ctext, add_special_tokens=False)["input_ids"])
                if not retokenisation_check(prompts.tokenizer, text, ids, ctext, completion, count):
                    mismatched += 1
            prompts.check(completion, prompt["id"])
            records.append({**labelled(prompt), "prompt_ids": ids, "completion_ids": completion})
            emit("ground_truth", done=i + 1, total=total, cached=False, tokens=len(completion))
    if text_only:
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
