"""The default eval drafts blocks only where rounds start, samples in lockstep, and gives the
rounds of drafting at every position and of online decoding, sample by sample, round by round.

Each architecture gets a tiny target and a 2-layer drafter trained on it for real (so the
layers before the last, where blocks of several samples share projections but attend to
their own contexts, matter), plus a copy of that drafter whose first layer is a causal
sliding-window layer. A batch holds samples of different prompt and completion lengths,
down to a completion of one token (no rounds at all). References: the online speculative
loop (`tests/helpers/oracle.online_rounds`, transformers' own model), the engine drafting
every position one sample at a time (``positions="all"``) and, for DDTree, every budget's
whole tree built at every position (`tests/helpers/oracle.plain_ddtree_rounds`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from orchestrator.demo.architectures import Dims, save_tiny
from remote.eval.drafter import load_drafter, read_config
from remote.eval.drafter_model import Blocks
from remote.eval.engine import run_eval
from remote.eval.target import load_target
from remote.eval.walk import (
    LOCKSTEP_SAMPLES,
    WalkOptions,
    ahead,
    context_kv_bytes,
    eval_batch,
    eval_sequence,
    room,
)
from remote.protocol import EvalSpec
from tests.helpers.drafters import build_drafter
from tests.helpers.oracle import hf_model, online_rounds, plain_ddtree_rounds

torch.set_num_threads(1)

# (architecture, whether its cache cannot be cropped back: recurrent state, sliding windows)
KINDS = [("qwen3", False), ("qwen3_5", True), ("gemma3_text", True)]
DIMS = Dims(hidden=64, layers=4, vocab=160, max_positions=256, window=8)
BLOCK = 6
BUDGETS = [2, 5, 16]
# (prompt length, completion length) of the batch's samples: long and short, one token
LENGTHS = [(10, 30), (6, 9), (10, 21), (6, 2), (10, 1), (6, 30)]


def sliding_copy(src: str, dst: Path) -> str:
    """The drafter at ``src`` with its first layer made a sliding-window (so causal,
    z-lab's rule) layer of window 4."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    cfg.update(layer_types=["sliding_attention"] + ["full_attention"] * (n - 1), sliding_window=4)
    (dst / "config.json").write_text(json.dumps(cfg))
    return str(dst)


def build_setup(kind: str, recompute: bool, root: Path) -> dict:
    """The target of architecture ``kind``, its two drafters, and the batch's samples."""
    from orchestrator.demo.train import make_ground_truth, train_drafter

    target = str(save_tiny(kind, root / "target", DIMS))
    rows = make_ground_truth(target, 8, prompt_len=10, completion_len=30, seed=1)
    trained = train_drafter(
        target,
        str(root / "drafters"),
        save_steps=(150,),
        block_size=BLOCK,
        num_layers=2,
        rows=rows,
        batch_samples=4,
    )[0]
    short = iter(make_ground_truth(target, 3, prompt_len=6, completion_len=30, seed=2))
    long = iter(rows[:3])
    samples = []
    for p, c in LENGTHS:
        row = next(long if p == 10 else short)
        samples.append((row["prompt_ids"], row["completion_ids"][:c]))
    return {
        "target": target,
        "drafters": [trained, sliding_copy(trained, root / "sliding")],
        "samples": samples,
        "recompute": recompute,
    }


@pytest.fixture(scope="module")
def setups(tmp_path_factory):
    """``setups(kind)``: `build_setup` of that architecture, built once, when first asked."""
    built: dict[str, dict] = {}

    def get(kind: str) -> dict:
        if kind not in built:
            built[kind] = build_setup(kind, dict(KINDS)[kind], tmp_path_factory.mktemp(kind))
        return built[kind]

    return get


def drafted_bound(rounds: list[int], samples: int = 1) -> int:
    """The most blocks a walk of these rounds asks for (`remote.eval.walk.ahead`): each
    round's start, and after a short round (or before the first) the rest of a window, as
    wide as a step with one sample asking allows."""
    short = sum(n <= 2 for n in rounds)
    return len(rounds) + (room(samples, BLOCK) - 1) * (short + 1) if rounds else 0


@pytest.mark.slow
def test_a_tree_verifying_online_loop_gives_the_walks_ddtree_rounds(setups):
    """`orchestrator.demo.oracle.ddtree_rounds`, a serving loop that verifies each round's
    tree in one target forward under the tree mask (the one `remote.eval.costs` times),
    decodes the target's greedy output and accepts what the walk's DDTree accepts."""
    from orchestrator.demo.oracle import ddtree_rounds

    s = setups("qwen3")
    model = hf_model(s["target"])
    target = load_target(s["target"], torch.float32)
    drafter, _ = load_drafter(s["drafters"][0], torch.float32)
    samples = [(p, c) for p, c in s["samples"] if len(c) > 1]
    walked = eval_batch(target, drafter, samples, WalkOptions(budgets=BUDGETS, positions="walk"))
    longest = 0
    for (prompt, completion), rec in zip(samples, walked, strict=True):
        for budget in BUDGETS:
            rounds, produced = ddtree_rounds(model, drafter, prompt, len(completion), budget)
            assert produced == completion
            assert rounds == rec["ddtree"][str(budget)], (budget, prompt)
            longest = max(longest, *rounds)
    assert longest >= 2  # some tree node was accepted (deeper paths: test_round_costs)


@pytest.mark.parametrize("kind", [k for k, _ in KINDS])
def test_walk_rounds_equal_all_positions_and_online_decoding(setups, kind):
    s = setups(kind)
    model = hf_model(s["target"])
    target = load_target(s["target"], torch.float32)
    long_rounds = 0
    for path in s["drafters"]:
        drafter, _ = load_drafter(path, torch.float32)
        batch = eval_batch(
            target, drafter, s["samples"], WalkOptions(budgets=BUDGETS, positions="walk")
        )
        assert len(batch) == len(s["samples"])
        for (prompt, completion), rec in zip(s["samples"], batch, strict=True):
            online, produced = online_rounds(
                model, drafter, prompt, len(completion), recompute=s["recompute"]
            )
            assert produced == completion  # the ground truth is the target's greedy output
            every = eval_sequence(
                target, drafter, prompt, completion, WalkOptions(budgets=BUDGETS, positions="all")
            )
            assert rec["rounds"] == every["rounds"] == online
            assert rec["ddtree"] == every["ddtree"]
            if len(completion) > 1:
                plain = plain_ddtree_rounds(target, drafter, prompt, completion, BUDGETS, None)
                assert rec["ddtree"] == plain
            assert rec["agreement"] == every["agreement"]
            # blocks where walks start rounds, and after a short round the next B/2
            chain = drafted_bound(rec["rounds"])
            assert len(rec["rounds"]) <= rec["positions_drafted"] <= chain
            trees = sum(drafted_bound(r) for r in rec["ddtree"].values())
            assert rec["positions_drafted"] <= rec["blocks_drafted"] <= chain + trees
            assert every["positions_drafted"] == len(completion) - 1
            # per-position acceptance over the round starts (all of them: over every position)
            assert rec["position_attempts"][0] == len(rec["rounds"])
            assert every["position_attempts"][0] == len(completion) - 1
            long_rounds += sum(r >= 3 for r in online)
        assert batch[4]["rounds"] == [] and batch[4]["tau"] is None  # a one-token completion
    assert long_rounds >= 10, "the drafters accept too little for the comparison to mean much"


def test_blocks_of_several_sequences_equal_each_drafted_alone(tmp_path):
    """One drafter call over blocks of three sequences (different lengths, a causal sliding
    layer first) gives every row of every block as drafting each sequence alone; rows asked
    in any order come back in that order."""
    folder = build_drafter(
        tmp_path / "d",
        [0, 2],
        layers=3,
        block_size=5,
        extra_config={
            "layer_types": ["sliding_attention", "full_attention", "full_attention"],
            "sliding_window": 3,
        },
    )
    drafter, _ = load_drafter(str(folder), torch.float32)
    cfg = read_config(str(folder))
    g = torch.Generator().manual_seed(0)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g)
    kvs, tokens = [], []
    for n in (9, 23, 15):
        feats = torch.randn(n, 2 * cfg.hidden_size, generator=g)
        kvs.append(drafter.context_kv(feats))
        tokens.append(torch.randint(0, cfg.vocab_size, (n,), generator=g))
    keys = [(0, 3), (0, 8), (1, 1), (1, 12), (1, 22), (2, 7)]
    seq = torch.tensor([i for i, _ in keys])
    st = torch.tensor([s for _, s in keys])
    first = torch.stack([tokens[i][s] for i, s in keys])
    with torch.inference_mode():
        mixed = drafter.blocks(kvs, st, first, embed, seq=seq)
        alone = [
            drafter.blocks(kvs[i], st[[b]], first[[b]], embed) for b, (i, _) in enumerate(keys)
        ]
        want = torch.cat([a.hidden() for a in alone])
        torch.testing.assert_close(mixed.hidden(), want, rtol=1e-5, atol=1e-5)
        rows = torch.tensor([5 * 4 + 2, 0 * 5 + 1, 5 * 2 + 4, 5 * 5 + 3, 5 * 1 + 1, 5 * 3 + 2])
        torch.testing.assert_close(
            mixed.hidden(rows), want.reshape(-1, cfg.hidden_size)[rows], rtol=1e-5, atol=1e-5
        )
        # blocks drafted in two calls, joined in another order, answer one call the same
        a = drafter.blocks(kvs, st[:3], first[:3], embed, seq=seq[:3])
        b = drafter.blocks(kvs, st[3:], first[3:], embed, seq=seq[3:])
        joined = Blocks.joined([(b, [2, 0]), (a, [1])])
        torch.testing.assert_close(joined.hidden(), want[[5, 3, 1]], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            joined.hidden(torch.tensor([2 * 5 + 3, 0 * 5 + 1])),
            want[[1, 5], [3, 1]],
            rtol=1e-5,
            atol=1e-5,
        )


@pytest.mark.parametrize("kind", ["qwen3", "gemma3_text"])
def test_context_taken_in_chunks_gives_the_online_rounds(setups, kind, monkeypatch):
    """With the drafter's context attention taken 8 positions at a time (`Attention.mix`
    past `CONTEXT_CHUNK`; 2048 otherwise), the walk's rounds are still online decoding's,
    for the full-attention drafter and the one with a sliding-window first layer."""
    from remote.eval import drafter_layers

    s = setups(kind)
    model = hf_model(s["target"])
    target = load_target(s["target"], torch.float32)
    for path in s["drafters"]:
        drafter, _ = load_drafter(path, torch.float32)
        want = [
            online_rounds(model, drafter, p, len(c), recompute=s["recompute"])[0]
            for p, c in s["samples"]
        ]
        monkeypatch.setattr(drafter_layers, "CONTEXT_CHUNK", 8)
        batch = eval_batch(target, drafter, s["samples"], WalkOptions(budgets=BUDGETS))
        monkeypatch.undo()
        assert [rec["rounds"] for rec in batch] == want
        assert max(len(p) + len(c) for p, c in s["samples"]) > 4 * 8  # several chunks


def test_chunked_context_attention_equals_one_pass(tmp_path, monkeypatch):
    """Blocks against a 300-position context, the context taken 32 positions at a time,
    equal one softmax over all of it (a causal sliding layer first, window 40)."""
    from remote.eval import drafter_layers

    folder = build_drafter(
        tmp_path / "d",
        [0, 2],
        layers=3,
        block_size=5,
        extra_config={
            "layer_types": ["sliding_attention", "full_attention", "full_attention"],
            "sliding_window": 40,
        },
    )
    drafter, _ = load_drafter(str(folder), torch.float32)
    cfg = read_config(str(folder))
    g = torch.Generator().manual_seed(0)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g)
    kv = drafter.context_kv(torch.randn(300, 2 * cfg.hidden_size, generator=g))
    st = torch.tensor([20, 31, 95, 200, 299])
    first = torch.randint(0, cfg.vocab_size, (5,), generator=g)
    with torch.inference_mode():
        whole = drafter.blocks(kv, st, first, embed).hidden()
        monkeypatch.setattr(drafter_layers, "CONTEXT_CHUNK", 32)
        chunked = drafter.blocks(kv, st, first, embed).hidden()
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-5)
    assert not torch.equal(chunked[2:], whole[2:])  # taken otherwise indeed


class Given:
    """The ``given`` of `eval_stream` (each sample's features and greedy argmax, computed
    beforehand), noting the order the samples are asked for in ``asked``."""

    def __init__(self, target, drafter, samples):
        self.rows = [
            target.forward(p + c, drafter.cfg.target_layer_ids, argmax_from=len(p) - 1)
            for p, c in samples
        ]
        self.asked: list[int] = []

    def __getitem__(self, n: int):
        self.asked.append(n)
        return self.rows[n]


def test_the_pool_streams_records_and_bounds_who_walks(setups, monkeypatch):
    """With a pool of 2 samples, a sample joins when another's walks end: each record comes
    as its walks end (the slowest sample, first in line, holds back none of the others'),
    the first before the last sample has joined, no drafter call holds blocks of more than
    2 samples, and every record equals the one-batch eval's. A byte bound below two
    samples' context K/V lets one sample walk at a time, never none."""
    import remote.eval.drafts as drafts
    import remote.eval.walk as walk

    s = setups("qwen3")
    target = load_target(s["target"], torch.float32)
    drafter, _ = load_drafter(s["drafters"][0], torch.float32)
    opts = WalkOptions(budgets=BUDGETS, positions="walk")
    # windows of B/2, as in a full pool: a walk's steps then follow its rounds, so the
    # longest walk ends last, whatever the pool's size
    monkeypatch.setattr(walk, "WINDOW_BLOCKS", 0)
    with torch.inference_mode():
        first = eval_batch(
            target, drafter, s["samples"], opts, Given(target, drafter, s["samples"])
        )
    # the sample of the longest walk first, so the pool's other sample ends before it
    steps = [max(len(w) for w in (r["rounds"], *r["ddtree"].values())) for r in first]
    by_steps = sorted(range(len(steps)), key=lambda n: -steps[n])
    assert steps[by_steps[0]] > steps[by_steps[1]]
    samples = [s["samples"][n] for n in by_steps] * 2
    with torch.inference_mode():
        given = Given(target, drafter, samples)
    whole = eval_batch(target, drafter, samples, opts, given)
    assert len(samples) <= LOCKSTEP_SAMPLES and given.asked == list(range(len(samples)))

    walking, build = [], drafts.Drafts._build

    def counted(self, keys):
        walking.append((len(self.live), len({i for i, _s in keys})))
        return build(self, keys)

    monkeypatch.setattr(drafts.Drafts, "_build", counted)
    monkeypatch.setattr(walk, "LOCKSTEP_SAMPLES", 2)
    given.asked.clear()
    order, asked_then = [], []
    for n, rec in walk.eval_stream(target, drafter, samples, opts, given):
        order.append(n)
        asked_then.append(len(given.asked))
        assert comparable(rec) == comparable(whole[n])
    assert sorted(order) == list(range(len(samples)))
    assert order[0] == 1  # the slowest sample's record holds back no other's
    assert given.asked == list(range(len(samples)))  # each sample asked for once, in order
    assert asked_then[0] < len(samples)  # streamed: the first record before the last joined
    assert max(live for live, _ in walking) == 2
    assert max(seqs for _, seqs in walking) == 2  # a call held blocks of both

    monkeypatch.setattr(walk, "LOCKSTEP_SAMPLES", 16)
    itemsize = drafter.fc.weight.element_size()
    least = min(context_kv_bytes(drafter.cfg, len(p) + len(c), itemsize) for p, c in samples)
    monkeypatch.setattr(walk, "LOCKSTEP_BYTES", least)  # no two fit together
    walking.clear()
    alone = eval_batch(target, drafter, samples, opts, given)
    assert {live for live, _ in walking} == {1}
    assert [comparable(r) for r in alone] == [comparable(r) for r in whole]


def comparable(rec: dict) -> dict:
    """A record but its timings."""
    return {k: v for k, v in rec.items() if k != "seconds"}


@pytest.mark.slow
def test_engine_walk_equals_all_positions_in_its_results(setups, tmp_path, monkeypatch):
    """`run_eval` with positions=walk walks samples in lockstep batches (made small here,
    so there are several), and its records equal the all-positions run's in rounds, DDTree and
    agreement; each sample's event says its place in the ground truth, and samples.jsonl
    keeps that order; the result says which positions the per-position acceptance
    covers."""
    import remote.eval.walk as walk

    monkeypatch.setattr(walk, "LOCKSTEP_SAMPLES", 4)
    s = setups("qwen3")
    gt = tmp_path / "gt.jsonl"
    gt.write_text(
        "".join(
            json.dumps({"id": f"x{i}", "prompt_ids": p, "completion_ids": c}) + "\n"
            for i, (p, c) in enumerate(s["samples"])
        )
    )
    results, events = {}, {}
    for positions in ("walk", "all"):
        out = tmp_path / positions
        spec = EvalSpec(
            target=s["target"],
            drafter=s["drafters"][0],
            ground_truth=str(gt),
            output_dir=str(out),
            dtype="float32",
            budgets=(4, 16),
            positions=positions,
        )
        events[positions] = []
        results[positions] = run_eval(spec, on_event=events[positions].append)
        lines = (out / "samples.jsonl").read_text().splitlines()
        results[positions]["records"] = [json.loads(line) for line in lines]
    walk_res, all_res = results["walk"], results["all"]
    assert walk_res["inputs"]["positions"] == "walk" and all_res["inputs"]["positions"] == "all"
    ids = [f"x{i}" for i in range(len(s["samples"]))]
    for name in ("walk", "all"):
        samples = [e for e in events[name] if e["event"] == "sample"]
        assert [e["done"] for e in samples] == [1, 2, 3, 4, 5, 6]
        assert sorted((e["index"], e["id"]) for e in samples) == list(enumerate(ids))
        assert [r["id"] for r in results[name]["records"]] == ids
    for a, b in zip(walk_res["records"], all_res["records"], strict=True):
        assert (a["rounds"], a["ddtree"], a["agreement"]) == (
            b["rounds"],
            b["ddtree"],
            b["agreement"],
        )
    wm, am = walk_res["metrics"], all_res["metrics"]
    for key in ("tau_per_sample_mean", "tau_token_weighted", "acceptance_histogram", "ddtree"):
        assert wm[key] == am[key]
    rounds = sum(len(r["rounds"]) for r in walk_res["records"])
    assert wm["per_position_acceptance"][0]["attempts"] == rounds
    assert am["per_position_acceptance"][0]["attempts"] == sum(len(c) - 1 for _p, c in s["samples"])
    assert walk_res["timings"]["drafter_s"] > 0 and walk_res["timings"]["ddtree_s"] > 0


def test_training_takes_its_gradient_through_a_chunked_context(tmp_path, monkeypatch):
    """The demo's trainer runs the same attention with gradients: with the context taken
    32 positions at a time, the loss's gradient is one pass's (nothing updated in place)."""
    from remote.eval import drafter_layers

    folder = build_drafter(tmp_path / "d", [0, 2], layers=2, block_size=5)
    drafter, _ = load_drafter(str(folder), torch.float32)
    drafter.requires_grad_(True)  # loaded for inference
    cfg = read_config(str(folder))
    g = torch.Generator().manual_seed(0)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g)
    feats = torch.randn(200, 2 * cfg.hidden_size, generator=g)
    st = torch.tensor([20, 95, 150, 199])
    blocks = drafter.block_inputs(embed, torch.randint(0, cfg.vocab_size, (4,), generator=g))

    def grads() -> list[torch.Tensor]:
        drafter.zero_grad()
        drafter.forward_blocks(drafter.context_kv(feats), st, blocks).square().sum().backward()
        return [p.grad.clone() for p in drafter.parameters() if p.grad is not None]

    whole = grads()
    monkeypatch.setattr(drafter_layers, "CONTEXT_CHUNK", 32)
    chunked = grads()
    assert len(chunked) == len(whole) > 0
    for a, b in zip(chunked, whole, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_walk_of_short_rounds_widens_its_window_when_few_samples_walk():
    B = 16
    assert room(LOCKSTEP_SAMPLES, B) == B // 2  # a full pool drafts as before
    assert room(1, B) > room(2, B) > B // 2
    assert ahead(40, [], 500, B, room(1, B)) == range(40, 48)  # no rounds yet: B/2
    assert ahead(40, [1, 5], 500, B, room(1, B)) == range(40, 41)  # a long last round
    widths = [len(ahead(0, [1] * k, 500, B, room(1, B))) for k in range(0, 12, 2)]
    assert widths == sorted(widths) and widths[-1] == room(1, B) > widths[0] == B // 2
    assert len(ahead(0, [1] * 10, 500, B, B // 2)) == B // 2  # no room: as before
    assert ahead(490, [1] * 10, 500, B, room(1, B)) == range(490, 500)


def test_a_lone_sample_of_short_rounds_drafts_them_in_few_large_calls(tmp_path, monkeypatch):
    """A sample walking alone through short rounds drafts its round starts a window of
    them per drafter call, growing up to the room of one sample, with the same rounds."""
    from remote.eval.drafter_model import DFlashDrafter

    target_dir = save_tiny("qwen3", tmp_path / "target", DIMS)
    target = load_target(str(target_dir), torch.float32)
    folder = build_drafter(tmp_path / "d", [1, 2], hidden=64, vocab=160, block_size=BLOCK)
    drafter, _ = load_drafter(str(folder), torch.float32)
    gen = torch.Generator().manual_seed(3)
    prompt, completion = (torch.randint(0, 150, (n,), generator=gen).tolist() for n in (8, 160))
    calls: list[int] = []
    real = DFlashDrafter.blocks

    def counted(self, *a, **k):
        calls.append(len(a[1]))
        return real(self, *a, **k)

    monkeypatch.setattr(DFlashDrafter, "blocks", counted)
    walked = eval_sequence(target, drafter, prompt, completion, WalkOptions(budgets=[]))
    monkeypatch.setattr(DFlashDrafter, "blocks", real)
    every = eval_sequence(target, drafter, prompt, completion, WalkOptions(positions="all"))
    rounds = walked["rounds"]
    assert rounds == every["rounds"] and max(rounds) <= 2
    # windows of B/2 blocks would take a call per B/2 rounds; these grow to room(1, B)
    assert len(calls) <= len(rounds) / 16
    assert sum(calls) == walked["blocks_drafted"] <= drafted_bound(rounds)
