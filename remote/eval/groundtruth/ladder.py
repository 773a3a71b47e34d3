"""A context ladder: each prompt at every rung after a history (docs/eval.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from remote.atomic import write_atomic
from remote.errors import UserError
from remote.eval.context_check import target_reaches
from remote.eval.groundtruth.prompts import load_prompts, load_tokenizer, render_prompt, select
from remote.protocol import GT_SOURCES, EvalSpec, JobSpec, sample_labels
from remote.protocol.ladder import longest, rung_name

Prepare = Callable[[JobSpec], tuple[str, dict]]


def build(job: JobSpec, folder: Path, prepare: Prepare, emit: Callable) -> tuple[JobSpec, dict]:
    """The job with its ladder's prompts (a file in `folder`) and what the result records."""
    if not GT_SOURCES[job.ground_truth.kind].reads_prompts:
        raise UserError(
            "a context ladder is built from prompts; a ground-truth file already holds its "
            "prompt ids (give --prompts, or put your own long prompts in the file)"
        )
    engine: EvalSpec = job.engine
    target_reaches(engine.target, longest(job.context_ladder, job.sampling.max_new_tokens))
    tokenizer = load_tokenizer(engine.target)
    pool = load_prompts(job.prompts, None, job.seed, job.prompts_sha256)
    finals = select(pool, job.samples, job.seed)
    order = {id(r): i for i, r in enumerate(pool)}
    ladder = Ladder(job, tokenizer, pool, folder, prepare, emit)
    records = []
    for rung in job.context_ladder:
        for final in finals:
            messages = ladder.fit(order[id(final)], final, rung)
            labels = sample_labels(final)
            records.append(
                {"id": f"{final['id']}@{rung_name(rung)}", **labels, "messages": messages}
            )
    path = folder / "ladder_prompts.jsonl"
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in records))
    info = {
        "rungs": list(job.context_ladder),
        "prompts": len(finals),
        "history_questions": len(ladder.answers),
        "history_ground_truth": ladder.sources,
        "file": str(path),
    }
    laddered = replace(
        job, prompts=str(path), prompts_sha256=None, samples=None, context_ladder=None
    )
    return laddered, info


class Ladder:
    """One job's ladder being built: question pool, answers so far, their entries."""

    def __init__(self, job: JobSpec, tokenizer, pool: list[dict], folder, prepare, emit):
        self.job, self.tokenizer, self.pool = job, tokenizer, pool
        self.folder, self.prepare, self.emit = folder, prepare, emit
        self.answers: dict[int, list[int]] = {}
        self.sizes: dict[int, int] = {}
        self.sources: list[dict] = []
        self.rounds = 0

    def length(self, messages: list[dict]) -> int:
        return len(render_prompt(self.tokenizer, {"messages": messages}, self.job.thinking)[1])

    def turn(self, j: int, answer: list[int] | None = None) -> list[dict]:
        ids = self.answers[j] if answer is None else answer
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return [
            {"role": "user", "content": self.pool[j]["text"]},
            {"role": "assistant", "content": text},
        ]

    def turns(self, chosen: list[int]) -> list[dict]:
        return [m for j in chosen for m in self.turn(j)]

    def turn_length(self, j: int) -> int:
        """About how many tokens turn `j` adds to a conversation (measured once)."""
        if j not in self.sizes:
            ask = [{"role": "user", "content": "?"}]
            self.sizes[j] = self.length(self.turn(j) + ask) - self.length(ask)
        return self.sizes[j]

    def fit(self, k: int, final: dict, rung: int) -> list[dict]:
        """Pool question `k` after the history reaching `rung` tokens, the last turn `cut`."""
        last = [{"role": "user", "content": final["text"]}]
        if self.length(last) >= rung:
            raise UserError(
                f"prompt {final['id']} alone is {self.length(last)} tokens, past the ladder's "
                f"rung of {rung}; start the ladder higher"
            )
        others = [*range(k + 1, len(self.pool)), *range(k)]
        chosen, est = [], self.length(last)
        for j in others:
            self.ensure(others, j, rung)
            chosen.append(j)
            est += self.turn_length(j)
            if est >= rung:
                est = self.length(self.turns(chosen) + last)
                if est >= rung:
                    break
        else:
            raise UserError(
                f"the prompts file's {len(self.pool)} questions with their answers make "
                f"{self.length(self.turns(chosen) + last)} tokens, short of the ladder's "
                f"rung of {rung}; use a larger prompts set"
            )
        while len(chosen) > 1 and self.length(self.turns(chosen[:-1]) + last) >= rung:
            chosen.pop()  # the sizes overshot: the fewest turns that reach the rung
        history = self.turns(chosen[:-1])
        return history + self.cut(history, chosen[-1], last, rung) + last

    def cut(self, history: list[dict], j: int, last: list[dict], rung: int) -> list[dict]:
        """Turn `j` cut to land on `rung`: its answer's first tokens, else its question's."""
        ids = self.answers[j]
        m = least(lambda m: self.length(history + self.turn(j, ids[:m]) + last), rung, len(ids))
        if m > 0:
            return self.turn(j, ids[:m])
        q = self.tokenizer(self.pool[j]["text"], add_special_tokens=False)["input_ids"]

        def asked(n: int) -> list[dict]:
            text = self.tokenizer.decode(q[:n], skip_special_tokens=True)
            return [{"role": "user", "content": text}, {"role": "assistant", "content": ""}]

        return asked(least(lambda n: self.length(history + asked(n) + last), rung, len(q)))

    def ensure(self, others: list[int], j: int, rung: int) -> None:
        """Answers for question `j` and, in one request, the next ones the rung will likely need."""
        if j in self.answers:
            return
        want, need = [], rung
        for i in others[others.index(j) :]:
            if need <= 0:
                break
            if i not in self.answers:
                want.append(i)
            got = self.answers.get(i)
            size = len(got) if got is not None else self.job.sampling.max_new_tokens
            need -= size + len(self.pool[i]["text"]) // 4
        self.answer(want)

    def answer(self, indices: list[int]) -> None:
        """The target's answers to pool questions `indices` (cached ground truth)."""
        self.rounds += 1
        path = self.folder / f"ladder_history_{self.rounds}.jsonl"
        lines = [{"id": f"h{i}", "prompt": self.pool[i]["text"]} for i in indices]
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in lines))
        self.emit("phase", phase="ladder_history", questions=len(indices))
        history = replace(
            self.job, prompts=str(path), prompts_sha256=None, samples=None, context_ladder=None
        )
        gt_path, info = self.prepare(history)
        for line in Path(gt_path).read_text().splitlines():
            row: dict[str, Any] = json.loads(line)
            self.answers[int(row["id"][1:])] = row["completion_ids"]
        self.sources.append({k: info.get(k) for k in ("cache_key", "cached", "samples")})


def least(length: Callable[[int], int], rung: int, most: int) -> int:
    """The fewest tokens `m` whose `length(m)` reaches `rung`: guess, step 8, halve."""
    none = length(0)
    if none >= rung:
        return 0
    low, high = 1, most
    guess = min(most, max(1, rung - none))
    if length(guess) >= rung:
        high, probe = guess, max(1, guess - 8)
        if length(probe) < rung:
            low = probe + 1
    else:
        low, probe = guess + 1, min(most, guess + 8)
        if probe >= low and length(probe) >= rung:
            high = probe
    while low < high:
        mid = (low + high) // 2
        if length(mid) >= rung:
            high = mid
        else:
            low = mid + 1
    return low
