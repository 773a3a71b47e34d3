"""How close is the speedup the results estimate to a measured speculative loop's?

Builds a small Qwen3 target (`orchestrator.demo.models`), trains a DFlash drafter on its
own greedy completions (`orchestrator.demo.train`), then on the same prompts times:

- plain greedy decoding: one target forward per token over a KV cache (transformers'
  model, as the reference loop uses it);
- the reference online loop (`orchestrator.demo.oracle.online_rounds`): the drafter
  drafts a block, the target verifies it over its cropped KV cache;
- with ``--budgets``, per DDTree node budget, the tree-verifying loop
  (`orchestrator.demo.oracle.ddtree_rounds`): the drafter's block as a best-first tree,
  verified in one target forward under the tree mask, the cache kept to the accepted path;

and compares each one's ratio to plain decoding (the measured speedup) with the estimate
the results show (`orchestrator.results.speedup.formula`) from the round costs the eval
host records (`remote.eval.costs.round_costs`: the chain's verify, each budget's tree
verify) and the loop's own token-weighted tau. Prints both, their ratio and the load
average (this box is shared: compare ratios from one run).

    python benchmarks/speedup.py [--hidden 256] [--layers 4] [--new-tokens 40] [--budgets 4 16]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common.measure import load_avg


def greedy_seconds(model, prompt: list[int], new_tokens: int) -> float:
    """Seconds of plain greedy decoding of `new_tokens` after `prompt`, one token a step
    (its prefill included, as the reference loop's is)."""
    import torch
    from transformers import DynamicCache

    from orchestrator.demo.oracle import cache_kwarg

    with torch.inference_mode():
        start = time.perf_counter()
        cache = DynamicCache(config=model.config)
        out = model(input_ids=torch.tensor([prompt]), **cache_kwarg(model, cache), use_cache=True)
        tok = int(out.logits[0, -1].argmax())
        for _ in range(new_tokens - 1):
            step = torch.tensor([[tok]])
            out = model(input_ids=step, **cache_kwarg(model, cache), use_cache=True)
            tok = int(out.logits[0, -1].argmax())
        return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=40)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--budgets", type=int, nargs="*", default=[])
    args = ap.parse_args()

    import torch

    from orchestrator.demo.models import build_qwen3_target
    from orchestrator.demo.oracle import ddtree_rounds, hf_model, online_rounds
    from orchestrator.demo.train import make_ground_truth, train_drafter
    from orchestrator.results.speedup import formula
    from remote.eval import drafter as drafter_mod
    from remote.eval import target as target_mod
    from remote.eval.costs import round_costs

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        target_dir = build_qwen3_target(
            str(Path(tmp) / "target"), hidden_size=args.hidden, num_layers=args.layers
        )
        ckpt = train_drafter(target_dir, str(Path(tmp) / "drafter"), save_steps=(150,))[-1]
        model = hf_model(target_dir)
        target = target_mod.load_target(target_dir, torch.float32)
        drafter, _ = drafter_mod.load_drafter(ckpt, torch.float32, target.info.num_layers)
        # The drafter's own training prompts (train_drafter draws them with seed + 1): it
        # accepts there, as the demo's drafters do on what they learned.
        rows = make_ground_truth(target_dir, args.prompts, completion_len=1, seed=1)
        prompts = [r["prompt_ids"] for r in rows]
        print(f"load before: {load_avg()}")
        plain = spec = 0.0
        rounds: list[int] = []
        for p in prompts:
            plain += greedy_seconds(model, p, args.new_tokens)
            t = time.perf_counter()
            r, completion = online_rounds(model, drafter, p, args.new_tokens)
            spec += time.perf_counter() - t
            rounds += r
        measured = plain / spec
        tau_tokens = sum(rounds) / len(rounds)
        p = prompts[0]
        sizes = [drafter.block_size, *[b + 1 for b in args.budgets]]
        ids = p + completion[: args.new_tokens // 2] + [completion[-1]] * max(sizes)
        c = round_costs(target, drafter, ids, sizes, torch.device("cpu"), args.budgets)
        est = formula(
            tau_tokens,
            c["target_step_s"],
            c["target_verify_s"][str(drafter.block_size)],
            c["drafter_round_s"],
        )
        block = drafter.block_size
        print(
            f"tau (token-weighted) {tau_tokens:.2f}; costs: step "
            f"{1e3 * c['target_step_s']:.2f} ms, verify({block}) "
            f"{1e3 * c['target_verify_s'][str(block)]:.2f} ms, drafter "
            f"{1e3 * c['drafter_round_s']:.2f} ms"
        )
        print(
            f"speedup: measured {measured:.2f}x (greedy {plain:.2f} s, reference loop {spec:.2f} s)"
            f", estimated {est:.2f}x; estimate / measured {est / measured:.2f}  (load {load_avg()})"
        )
        for budget in args.budgets:
            tree, rounds = 0.0, []
            for p in prompts:
                t = time.perf_counter()
                r, _ = ddtree_rounds(model, drafter, p, args.new_tokens, budget)
                tree += time.perf_counter() - t
                rounds += r
            tau_tree = sum(rounds) / len(rounds)
            verify = c["tree_verify_s"][str(budget)]
            est = formula(tau_tree, c["target_step_s"], verify, c["drafter_round_s"])
            measured = plain / tree
            print(
                f"DDTree-{budget}: tau (token-weighted) {tau_tree:.2f}, tree verify "
                f"{1e3 * verify:.2f} ms; measured {measured:.2f}x (loop {tree:.2f} s), "
                f"estimated {est:.2f}x; estimate / measured {est / measured:.2f}  "
                f"(load {load_avg()})"
            )


if __name__ == "__main__":
    main()
