"""The CPU threads a job computes with when nobody named any: one for a tiny target (its
matrices too small to share out; on a busy host torch's threads mostly wait for each
other: benchmarks/eval_threads.py), torch's own count for a real one and on a GPU, said
in one ``note`` event; a job's own threads are never replaced."""

from __future__ import annotations

import os

from remote.eval.device import SMALL_TARGET_BYTES, auto_threads
from remote.eval.job import with_threads
from remote.protocol import EvalSpec


class Events:
    def __init__(self):
        self.seen: list[tuple[str, dict]] = []

    def emit(self, event: str, **fields) -> None:
        self.seen.append((event, fields))


def test_a_tiny_target_computes_on_one_thread_and_says_so(tiny_target):
    threads, why = auto_threads(str(tiny_target), "cpu")
    assert threads == 1 and why.startswith("threads: 1, the target's weights being ")
    events = Events()
    engine = with_threads(EvalSpec(target=str(tiny_target)), events)
    assert engine.threads == 1
    assert events.seen == [("note", {"message": why})]


def test_a_real_target_a_gpu_and_a_chosen_count_keep_torchs_or_their_own(tmp_path, tiny_target):
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "model.safetensors", "wb") as fh:  # sparse: its size is what counts
        os.truncate(fh.fileno(), SMALL_TARGET_BYTES + 1)
    assert auto_threads(str(big), "cpu") == (None, None)
    assert auto_threads(str(tiny_target), "cuda:0") == (None, None)
    events = Events()
    assert with_threads(EvalSpec(target=str(tiny_target), threads=3), events).threads == 3
    assert with_threads(EvalSpec(target=str(big)), events).threads is None
    assert events.seen == []
