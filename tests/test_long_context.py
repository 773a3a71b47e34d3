"""The engine at long context, bounded (#51): a long sample's features go to the host's
cache and come back without being held twice, as a file safetensors reads; the memory
estimate grows with the context linearly, its drafter scores not at all past a chunk."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from remote.eval.feature_cache import FeatureCache
from tests.helpers.cli import ROOT

# A sample's features of 200 MB: 25,000 positions x 4096 wide (two 2048-wide layers) in
# bfloat16, a 25k context of a small target.
T, WIDTH, PROMPT = 25_000, 4096, 24_900
CONTEXT = {"v": 1, "target": {"path": "/t", "config_sha256": "c"}, "layer_ids": [1, 2]}

_STEP = """
import json, resource, sys, torch
from remote.eval.feature_cache import FeatureCache
root, context, width, T, P, step = json.loads(sys.argv[1])
prompt, completion = list(range(P)), list(range(T - P))
cache = FeatureCache(root, 2**32).open(context, width)
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if step == "store":
    feats = torch.full((T, width), 0.5, dtype=torch.bfloat16)
    feats[::7] = -2.0
    greedy = torch.arange(T - P + 1)
    before = peak()
    cache.store(prompt, completion, feats, greedy)
    print(json.dumps({"stored": cache.stored, "grew": peak() - before}))
else:
    before = peak()
    got = cache.lookup(prompt, completion, torch.bfloat16)
    ok = got is not None and float(got[0][7, 3]) == -2.0 and int(got[1][-1]) == T - P
    print(json.dumps({"ok": ok, "grew": peak() - before}))
"""


def _step(root, step: str) -> dict:
    args = json.dumps([str(root), CONTEXT, WIDTH, T, PROMPT, step])
    proc = subprocess.run(
        [sys.executable, "-c", _STEP, args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_a_long_sample_is_kept_and_read_back_without_a_second_copy(tmp_path):
    """Writing the entry copies none of its 200 MB; reading it takes one copy (the
    tensor), where the whole file read first and then parsed took two."""
    size = T * WIDTH * 2
    stored = _step(tmp_path, "store")
    assert stored["stored"] == 1 and stored["grew"] < size // 4, stored
    read = _step(tmp_path, "lookup")
    assert read["ok"] and read["grew"] < 1.5 * size, read
    from safetensors.torch import load_file  # the entry is a file safetensors itself reads

    (entry,) = (tmp_path).glob("*.safetensors")
    got = load_file(entry)
    assert got["features"].shape == (T, WIDTH) and got["greedy"].shape == (T - PROMPT + 1,)
    cache = FeatureCache(tmp_path, 2**32).open(CONTEXT, WIDTH)
    assert cache.holds(list(range(PROMPT)), list(range(T - PROMPT)))


def test_the_estimate_grows_linearly_and_its_scores_stop_at_a_chunk():
    """A z-lab-sized drafter (5 layers over a 5120-wide target, 32 heads, blocks of 16):
    the working set from 32k to 64k tokens grows by what the context holds (features,
    activations, context K/V), not by drafter scores."""
    from remote.eval.drafter_config import DrafterConfig
    from remote.eval.memory import context_bytes

    cfg = DrafterConfig.from_dict(
        {
            "hidden_size": 5120,
            "num_hidden_layers": 5,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 17408,
            "vocab_size": 248320,
            "block_size": 16,
            "dflash_config": {"target_layer_ids": [1, 16, 31, 46, 61], "mask_token_id": 0},
        }
    )
    at = {n: context_bytes(cfg, n, 2) for n in (16_384, 32_768, 65_536)}
    # per token: the features once (5 layers x 5120, bf16), the target's activations
    # (8 float32 rows of 5120), the drafter's context K/V (5 layers x K, V x 8 x 128, bf16)
    per_token = 5 * 5120 * 2 + 5120 * 8 * 4 + 5 * 2 * 8 * 128 * 2
    assert at[65_536] - at[32_768] == 32_768 * per_token
    assert at[32_768] - at[16_384] == 16_384 * per_token
