"""The offline (teacher-forced) acceptance walk (its dataset metrics: `remote.eval.metrics`).

Per sequence ``g = prompt + completion`` (``P`` prompt tokens, last index ``L``):

1. ONE target forward over ``g``: context features of every position (hooks) and the
   target's own greedy argmax (for the agreement rate). Then the drafter's context K/V
   once, and the features are dropped.
2. The walk, exactly as greedy online decoding: ``s = P``; draft the block at ``s``,
   ``a_s`` = leading draft tokens equal to ``g[s+1..]`` (capped at ``L``); round length
   ``min(a_s + 1, L - s)``; ``s += length``; stop at ``L``. (The first completion token
   comes from the target's prefill, as in z-lab's loop, and is not a round.) Blocks are
   always ``B`` long, as in a generation that ends on EOS. The samples of a pool walk in
   lockstep (a sample joins when another's walks end, `eval_stream`), and with them the
   DDTree walks of step 3 (`Lockstep`): each step drafts, in ONE drafter call, the blocks
   every unfinished walk asks for and no earlier step drafted, so the drafter's rows are
   about rounds x ``B``, not positions x ``B``, and a block is drafted once for all the
   walks that start rounds there. The last drafter layer and the head run depth by depth,
   only for blocks still matching: about tau rows per block instead of ``B``
   (`remote.eval.drafter_model.Blocks`). With ``positions="all"`` every completion
   position's block is drafted first (batched), for per-position acceptance over all of
   them.
3. DDTree-N walks the same way with tree acceptance, from per-depth top-k log-probs of the
   drafter at the positions that walk visits. One `remote.eval.ddtree.TreeSearch` per
   visited position answers every budget at once (a smaller budget's tree is the first
   nodes of the largest one's), and asks for a depth's row only when the best-first order
   reaches it or the ground truth is still in the tree: the rows step 2 computed are
   reused, and so are the blocks (their last layer's inputs, `remote.eval.drafts.Drafts`
   keeps them), so a deeper row costs the last layer and the head only; a drafter that
   misses at depth 1 costs no more rows. The walks of all budgets and samples advance with
   the greedy ones, computing what they need in shared batches (`Lockstep`).
4. At a temperature above 0, the expectation at the walked blocks (`remote.eval.seeded`):
   sampled drafts take one more walk (`DRAWN`), seeded per sample, in the same steps.

Memory stays flat in the sequence length: drafter blocks, attention scores and head logits
go in batches of bounded bytes (`remote.eval.drafts`, which drafts and keeps the blocks),
the samples walking together are bounded by their context K/V's bytes
(`eval_stream`), DDTree keeps top-k rows (not logits) only for positions a walk can
still visit, and large buffers go back to the OS when freed (`bound_heap`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial

import torch

from remote.eval import drafts as _drafts
from remote.eval.drafts import Drafts, Seq
from remote.eval.heap import bound_heap

# The metrics live in a torch-free module shared with the orchestrator's shard merge;
# re-exported here for callers that know them from this module.
from remote.eval.metrics import ddtree_k, round_starts, summarize  # noqa: F401


@dataclass
class WalkOptions:
    """``budgets``: DDTree node budgets; ``topk``: per-depth candidates (None = the budget);
    ``block_chunk``: blocks per batched drafter call (memory vs speed; None = as many as
    `remote.eval.drafts.auto_chunk` allows); ``positions``: ``"walk"`` (the
    default) drafts blocks only where the walks start rounds, the chain walk's and each
    DDTree budget's (and, after a short round, the positions its next rounds likely
    start at: `ahead`, a wider window the fewer samples walk), the samples of a batch in
    lockstep, each step's blocks in shared drafter calls (per-position acceptance then
    covers the chain walk's round starts);
    ``"all"`` (opt-in) also drafts a block at every completion position first, so
    per-position acceptance covers all of them, as docs/dflash-eval.md describes it (the
    same rounds). ``sampler``: a sampled eval's `remote.eval.seeded.Walks` (its drawn
    walk, each record's ``expected``)."""

    budgets: list[int] = field(default_factory=list)
    topk: int | None = None
    block_chunk: int | None = None
    positions: str = "walk"
    sampler: object | None = None


DRAWN = -1  # the walk of sampled drafts (`remote.eval.seeded`)
LOCKSTEP_SAMPLES = 16  # samples walking together at most (`eval_stream`)
LOCKSTEP_BYTES = 256 * 2**20  # their drafter context K/V together, at most


def context_kv_bytes(cfg, tokens: int, itemsize: int) -> int:
    """Bytes of the drafter's context K/V (every layer) for a sequence of ``tokens``."""
    return cfg.num_layers * 2 * tokens * cfg.num_kv_heads * cfg.head_dim * itemsize


def _share(seconds: float, weights: dict[int, int], into: dict[int, float]) -> None:
    """Add ``seconds`` of a batched step to ``into``, split by each sequence's ``weights``
    (its blocks or walks in that step)."""
    total = sum(weights.values())
    for i, w in weights.items():
        if w:
            into[i] += seconds * w / total


WINDOW_BLOCKS = 64  # the blocks a step's windows may reach when few samples walk


def ahead(s: int, rounds: list[int], L: int, B: int, room: int | None = None) -> range:
    """The positions a walk standing at ``s`` asks to have drafted (its ``rounds`` so far):
    ``s``, and after a short last round (1-2 tokens, or none yet) a window from ``s``,
    where its next rounds likely start: ``B/2`` positions, twice that after every two more
    short rounds in a row, up to ``room`` (B/2 when it is not given). A run of short rounds
    then takes one drafter call for many of them (the drafter's weights read once, not once
    per round) for a few blocks no round uses; a walk making long rounds would skip most
    of them, so it asks for ``s`` only."""
    if rounds and rounds[-1] > 2:
        return range(s, min(s + 1, L))
    streak = next((k for k, n in enumerate(reversed(rounds)) if n > 2), len(rounds))
    half = max(1, B // 2)
    width = min(max(half, room or half), half << min(streak // 2, 16))
    return range(s, min(s + width, L))


def room(samples: int, B: int) -> int:
    """The window a walk may grow to when ``samples`` samples ask for blocks in a step:
    WINDOW_BLOCKS shared among them (B/2 at least), so a step's drafter call stays large
    when few samples are left, and a pool of many draft as before."""
    return max(max(1, B // 2), WINDOW_BLOCKS // max(1, samples))


@dataclass
class Walked:
    """One sequence's walks once they all ended: the greedy walk's and each DDTree
    budget's round lengths, and its shares of the steps' drafter and DDTree seconds."""

    rounds: list[int]
    ddtree: dict[str, list[int]]
    drafter_s: float
    ddtree_s: float
    drawn: list[int] | None = None


class Lockstep:
    """The greedy walk and the DDTree-N walks of every sequence `admit` took in, all
    advanced together, one `step` at a time; sequences join and leave between steps.

    Each step asks, for every unfinished walk, for the positions it wants (`ahead`): the
    greedy walk their acceptance, a DDTree walk their `TreeSearch` (one per position answers
    every budget, `Drafts.trees`). `Drafts.draft` drafts the blocks of both that it does not
    hold yet in shared drafter calls, then every walk moves through each round whose start
    is known, by its length ``min(a + 1, L - s)``. A step's drafting is shared among the
    sequences by the blocks it drafted for each, its tree searches by the DDTree walks
    served."""

    def __init__(self, drafts: Drafts, budgets: list[int], sampler=None):
        self.drafts, self.budgets, self.sampler = drafts, budgets, sampler
        drawn = (DRAWN,) if sampler is not None and sampler.draws else ()
        self.walks = (0, *budgets, *drawn)  # walk 0: greedy
        self.top = max(budgets, default=0)
        self.at: dict[tuple[int, int], int] = {}
        self.out: dict[int, dict[int, list[int]]] = {}
        self.chain_s: dict[int, float] = {}
        self.tree_s: dict[int, float] = {}

    def admit(self, i: int) -> None:
        """Start the walks of sequence ``i`` of `drafts` at its prompt's end."""
        for n in self.walks:
            self.at[(i, n)] = self.drafts.seqs[i].P
        self.out[i] = {n: [] for n in self.walks}
        self.chain_s[i] = self.tree_s[i] = 0.0

    def __len__(self) -> int:  # sequences walking
        return len(self.out)

    def _known(self, n: int) -> dict:
        return self.drafts.accept if n == 0 else self.sampler.drawn if n < 0 else self.drafts.search

    def step(self) -> dict[int, Walked]:
        """One step of every walk; returns the sequences whose walks have all ended."""
        drafts, seqs, B = self.drafts, self.drafts.seqs, self.drafts.B
        live = [(i, n) for (i, n), s in self.at.items() if s < seqs[i].L]
        if live:
            t = _drafts.CLOCK()
            built = {i: drafts.built[i] for i in self.out}
            want: dict[int, set] = {0: set(), self.top: set(), DRAWN: set()}
            asking = [(i, n) for i, n in live if (i, self.at[(i, n)]) not in self._known(n)]
            space = room(len({i for i, _n in asking}), B)
            for i, n in asking:
                want[n if n <= 0 else self.top].update(
                    (i, p) for p in ahead(self.at[(i, n)], self.out[i][n], seqs[i].L, B, space)
                )
            draw = sorted(key for key in want[DRAWN] if key not in self._known(DRAWN))
            extra = (draw, partial(self.sampler.draw, drafts)) if draw else None
            searched = drafts.draft(sorted(want[0]), sorted(want[self.top]), self.top, extra)
            for i, n in live:
                known = self._known(n)
                while self.at[(i, n)] < seqs[i].L and (i, self.at[(i, n)]) in known:
                    s = self.at[(i, n)]
                    a = known[(i, s)] if n <= 0 else known[(i, s)].accepted(n)
                    self.out[i][n].append(min(a + 1, seqs[i].L - s))
                    self.at[(i, n)] += self.out[i][n][-1]
            for i in {i for i, _n in live}:
                drafts.forget(i, min(self.at[(i, n)] for n in self.walks))
            spent = _drafts.CLOCK() - t
            new = {i: drafts.built[i] - b for i, b in built.items()}
            walking = {i: 1 for i, _n in live}
            _share(spent - searched, new if any(new.values()) else walking, self.chain_s)
            trees = {i: 0 for i in walking}
            for i, n in live:
                trees[i] += n > 0
            if any(trees.values()):
                _share(searched, trees, self.tree_s)
        ended = [i for i in self.out if all(self.at[(i, n)] >= seqs[i].L for n in self.walks)]
        done = {}
        for i in ended:
            out = self.out.pop(i)
            for n in self.walks:
                del self.at[(i, n)]
            ddtree = {str(n): out[n] for n in self.budgets}
            seconds = self.chain_s.pop(i), self.tree_s.pop(i)
            done[i] = Walked(out[0], ddtree, *seconds, out.get(DRAWN))
        return done


@torch.inference_mode()
def eval_sequence(
    target,
    drafter,
    prompt: list[int],
    completion: list[int],
    opts: WalkOptions,
    given: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict:
    """Evaluate one sample: `eval_batch` of that sample alone."""
    return eval_batch(
        target, drafter, [(prompt, completion)], opts, None if given is None else [given]
    )[0]


@torch.inference_mode()
def eval_batch(
    target,
    drafter,
    samples: list[tuple[list[int], list[int]]],
    opts: WalkOptions,
    given: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> list[dict]:
    """Every record of `eval_stream`, in sample order."""
    got = dict(eval_stream(target, drafter, samples, opts, given))
    return [got[n] for n in range(len(samples))]


@torch.inference_mode()  # entered around each step of the generator, not between them
def eval_stream(
    target,
    drafter,
    samples: list[tuple[list[int], list[int]]],
    opts: WalkOptions,
    given=None,
) -> Iterator[tuple[int, dict]]:
    """Evaluate ``samples`` (prompt, completion); yields ``(index, record)`` per sample
    (rounds, per-position counts, DDTree rounds, agreement, timings) as soon as its walks
    have ended: in the order the walks end, not the samples' (a step's in index order), so
    a slow sample holds back no other's record. See the module docstring for the
    procedure.

    Up to LOCKSTEP_SAMPLES samples walk together (with ``positions="all"`` one, whose every
    position already fills large calls), their context K/V within LOCKSTEP_BYTES (one
    sample at least), so each drafter call holds a block of every sample still walking;
    whenever a sample's walks end, the next samples join (target forward, context K/V)
    until the pool is full again, so the calls stay full to the end and no batch waits
    for its slowest sample. A record's drafter and DDTree seconds are its share of those
    calls.

    ``given``: per sample (features [T, len(target_layer_ids)*hidden], greedy argmax from
    position P-1) computed elsewhere (another host's target, `remote.eval.parity`; a
    feature cache, `remote.eval.cached_features.Features`), asked for when the sample joins,
    instead of step 1's forward; the target then lends only its embedding and head."""
    bound_heap()
    cfg = drafter.cfg
    cap = LOCKSTEP_SAMPLES if opts.positions == "walk" else 1
    itemsize = drafter.fc.weight.element_size()
    sizes = [context_kv_bytes(cfg, len(p) + len(c), itemsize) for p, c in samples]
    k = ddtree_k(max(opts.budgets), opts.topk, target.info.vocab_size) if opts.budgets else 0
    longest = max((len(p) + len(c) - 1 for p, c in samples), default=1)
    drafts = Drafts(drafter, target, [], opts.block_chunk, k, longest=longest)
    if opts.sampler is not None:
        opts.sampler.attach(drafts)
    pool = Lockstep(drafts, opts.budgets, opts.sampler)
    base: dict[int, dict] = {}
    nxt, emitted, held = 0, 0, 0
    while emitted < len(samples):
        while nxt < len(samples) and (
            not len(pool) or (len(pool) < cap and held + sizes[nxt] <= LOCKSTEP_BYTES)
        ):
            seq = _joined_seq(target, drafter, samples[nxt], given, nxt, base, opts.sampler)
            i = drafts.add(seq)
            assert i == nxt
            if opts.positions == "all":
                t = _drafts.CLOCK()
                drafts.ensure([(i, s) for s in range(drafts.seqs[i].P, drafts.seqs[i].L)])
                base[i]["drafter"] += _drafts.CLOCK() - t
            pool.admit(i)
            held += sizes[i]
            nxt += 1
        for i, walked in sorted(pool.step().items()):
            rec = _record(drafts, i, samples[i], base.pop(i), walked, opts.positions)
            if opts.sampler is not None:
                t = _drafts.CLOCK()
                rec["expected"] = opts.sampler.expected(drafts, i, walked)
                opts.sampler.leave(i)
                rec["seconds"]["drafter"] += _drafts.CLOCK() - t
                rec["seconds"]["total"] += _drafts.CLOCK() - t
            drafts.release(i)
            held -= sizes[i]
            emitted += 1
            yield i, rec


def _joined_seq(target, drafter, sample, given, n: int, base: dict[int, dict], sampler) -> Seq:
    """Sample ``n`` as the drafter sees it (step 1: its target forward, or ``given[n]``,
    then its drafter context K/V); its target and drafter seconds and its agreement go
    in ``base[n]``, its final rows to `sampler`."""
    prompt, completion = sample
    t0 = _drafts.CLOCK()
    g = list(prompt) + list(completion)
    P, L = len(prompt), len(g) - 1
    gt = torch.tensor(g, dtype=torch.long)
    layers, final = drafter.cfg.target_layer_ids, sampler is not None
    if given is not None:
        got = given[n]
    else:  # the final rows only where asked: another target's forward may not take it
        got = target.forward(g, layers, argmax_from=P - 1, **({"final": True} if final else {}))
    feats, greedy = got[:2]  # a sampled eval's cache gives its final rows too
    if final:
        rows = got[2] if len(got) > 2 else target.forward(g, layers, P - 1, final=True)[2]
        sampler.join(n, rows, L - P, drafter.block_size)
    t_target = _drafts.CLOCK() - t0
    # Agreement: target argmax at t predicts g[t+1], for every completion token.
    agree = int((greedy[: L - P + 1] == gt[P:]).sum())
    t1 = _drafts.CLOCK()
    kv = drafter.context_kv(feats.to(drafter.fc.weight.dtype))
    del feats, greedy
    base[n] = {"target": t_target, "drafter": _drafts.CLOCK() - t1, "agree": agree}
    return Seq(gt, P, kv)


def _record(drafts: Drafts, i: int, sample, base: dict, walked: Walked, positions: str) -> dict:
    """Sample ``i``'s record, from its walks and the acceptance `drafts` holds for it."""
    q, B = drafts.seqs[i], drafts.B
    attempts, hits = [0] * (B - 1), [0] * (B - 1)
    mine = {s: a for (j, s), a in drafts.accept.items() if j == i}
    if positions == "all":  # every completion position
        counted = sorted(mine)
    else:  # the chain walk's round starts
        counted = round_starts(q.P, walked.rounds)
    # Per-position: depth j attempted at s when the first j-1 were right and s+j <= L.
    for s in counted:
        a = mine[s]
        for j in range(1, min(a + 1, B - 1, q.L - s) + 1):
            attempts[j - 1] += 1
            hits[j - 1] += j <= a
    sec = {
        "target": base["target"],
        "drafter": base["drafter"] + walked.drafter_s,
        "ddtree": walked.ddtree_s,
    }
    return {
        "prompt_tokens": q.P,
        "completion_tokens": len(sample[1]),
        "rounds": walked.rounds,
        "tau": (sum(walked.rounds) / len(walked.rounds)) if walked.rounds else None,
        "position_attempts": attempts,
        "position_hits": hits,
        "positions_drafted": len(mine),
        "blocks_drafted": drafts.built[i],
        "agreement": {"match": base["agree"], "total": q.L - q.P + 1},
        "ddtree": walked.ddtree,
        "seconds": {**sec, "total": sum(sec.values())},
    }
