"""The real-width pair of `realscale.py`: a depth-truncated Qwen3.6-27B target and
real-width drafters, built once under a work folder, and the measurements each run in a
fresh child process (one model at a time, each child's own peak RSS).

Target: Qwen3.6-27B's published text config (`common.models.QWEN36_27B`: hidden 5120, 24
query / 4 kv heads of 256, Gated DeltaNet keys 16 x 128 and values 48 x 128, MLP 17408,
untied vocabulary 248320), its first ``layers`` layers (one period of its 3 linear : 1
full pattern at 4), bf16, random weights, text-only (``Qwen3_5ForCausalLM``).
Drafters: z-lab's Qwen3.6-27B drafter's width (hidden 5120, MLP 17408, 32 query / 8 kv
heads of 128, blocks of 16, features of 4 target layers: 20480 wide), 1 and 2 layers
(their difference is one layer before the last, which runs all 16 rows of every block).

Children (`child`, run by `measure`; each prints one JSON line):
- ``engine``: the engine's load, its first forward (the page-in) and, per sample, its
  forward's parts timed by hooks on each decoder layer; each drafter's walk over those
  features (drafter and DDTree parts);
- ``transformers``: ``from_pretrained``, its first forward and the bare forward per
  sample (``output_hidden_states=True``, full logits: what a hand-written harness does);
- ``gemm``: bf16 ``F.linear`` of every weight shape of each layer kind and of the head at
  the rows a forward gives it: the GEMM bound.
"""

from __future__ import annotations

import json
import os
import sys
import time

from .models import QWEN36_27B, random_seqs

DRAFTER = dict(
    hidden_size=5120,
    intermediate_size=17408,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    block_size=16,
    rms_norm_eps=1e-6,
    max_position_embeddings=262144,
)
MASK_ID = 248070  # a reserved token of Qwen3.6's vocabulary


def text_config(layers: int) -> dict:
    """Qwen3.6-27B's text config cut to its first ``layers`` layers (both kinds kept)."""
    text = dict(QWEN36_27B["text_config"])
    kinds = list(text["layer_types"][:layers])
    if "full_attention" not in kinds:  # 2 or 3 layers: the last one full, as every 4th
        kinds[-1] = "full_attention"
    return {**text, "num_hidden_layers": layers, "layer_types": kinds, "tie_word_embeddings": False}


def drafter_config(layers: int, target_layers: int, layer_ids: list[int]) -> dict:
    """A z-lab config of the real-width drafter: ``layers`` layers, features of the target's
    ``layer_ids`` (of its ``target_layers``)."""
    return dict(
        DRAFTER,
        architectures=["DFlashDraftModel"],
        model_type="qwen3",
        vocab_size=QWEN36_27B["text_config"]["vocab_size"],
        num_hidden_layers=layers,
        num_target_layers=target_layers,
        dflash_config={"target_layer_ids": layer_ids, "mask_token_id": MASK_ID},
    )


def build(workdir: str, layers: int) -> tuple[str, dict[int, str]]:
    """(target folder, {drafter layers: folder}) under ``workdir``, built once."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from remote.eval.drafter import DFlashDrafter, DrafterConfig, save_zlab

    work = os.path.join(workdir, f"qwen36-27b-l{layers}")
    target = os.path.join(work, "target")
    if not os.path.isfile(os.path.join(target, "config.json")):
        torch.manual_seed(0)
        cfg = Qwen3_5TextConfig(**text_config(layers))
        model = Qwen3_5ForCausalLM._from_config(cfg, dtype=torch.bfloat16)
        model.save_pretrained(target + ".tmp")
        del model
        os.replace(target + ".tmp", target)
    drafters = {}
    for n in (1, 2):
        folder = drafters[n] = os.path.join(work, f"drafter-{n}")
        if os.path.isfile(os.path.join(folder, "config.json")):
            continue
        dcfg = drafter_config(n, layers, list(range(layers))[-4:])
        torch.manual_seed(n)
        save_zlab(DFlashDrafter(DrafterConfig.from_dict(dcfg)).to(torch.bfloat16), folder + ".tmp")
        os.replace(folder + ".tmp", folder)
    return target, drafters


def samples(n: int, prompt: int, completion: int) -> list[tuple[list[int], list[int]]]:
    """``n`` random (prompt, completion) pairs in the target's vocabulary."""
    vocab = QWEN36_27B["text_config"]["vocab_size"]
    prompts, seqs = random_seqs(vocab, n, prompt, completion)
    return [(p, g[len(p) :]) for p, g in zip(prompts, seqs, strict=True)]


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def since(start: tuple[float, float]) -> dict[str, float]:
    wall, cpu = clocks()
    return {"wall": wall - start[0], "cpu": cpu - start[1]}


def _engine(cfg: dict) -> dict:
    """The ``engine`` child (see the module)."""
    import torch

    from remote.eval.device import computing
    from remote.eval.drafter import load_drafter
    from remote.eval.target import describe, load_target
    from remote.eval.walk import WalkOptions, eval_batch

    describe(cfg["target"])  # the modeling code imported: the load alone is timed
    t = clocks()
    target = load_target(cfg["target"], torch.bfloat16)
    out: dict = {"load": since(t), "linear_attention": target.linear_attention}
    data = [tuple(s) for s in cfg["samples"]]
    layer_ids = list(range(target.info.num_layers))[-4:]
    with computing(torch.device("cpu")):
        p, c = data[0]
        t = clocks()
        target.forward(p + c, layer_ids, argmax_from=len(p) - 1)
        out["first"] = since(t)
        times: dict = {"layers": {}, "total": {}}
        given = []
        for _ in range(cfg["repeats"]):
            given = [_timed_forward(target, n, s, layer_ids, times) for n, s in enumerate(data)]
        out["forward"] = times
        opts = WalkOptions(budgets=cfg["budgets"])
        for n, folder in sorted(cfg["drafters"].items()):
            drafter, _report = load_drafter(folder, torch.bfloat16)
            got = eval_batch(target, drafter, data, opts, given)
            out[f"drafter-{n}"] = {
                part: sum(r["seconds"][part] for r in got) for part in ("drafter", "ddtree")
            } | {"blocks": sum(r["blocks_drafted"] for r in got)}
            del drafter
    return out


def _timed_forward(target, n: int, sample, layer_ids, times: dict):
    """One engine forward of sample ``n`` with every decoder layer timed (pre and post
    hooks); keeps, in ``times``, the parts of its fastest forward over the repeats."""
    p, c = sample
    started: dict = {}
    spent: dict = {}
    hooks = []
    for i, layer in enumerate(target.layers):
        hooks.append(
            layer.register_forward_pre_hook(lambda *_a, i=i: started.update({i: clocks()}))
        )
        hooks.append(
            layer.register_forward_hook(lambda *_a, i=i: spent.update({i: since(started[i])}))
        )
    t = clocks()
    try:
        got = target.forward(p + c, layer_ids, argmax_from=len(p) - 1)
    finally:
        for h in hooks:
            h.remove()
    total = since(t)
    best = times["total"].get(str(n))
    if best is None or total["wall"] < best["wall"]:
        times["total"][str(n)] = total
        times["layers"][str(n)] = {str(i): v for i, v in spent.items()}
    return got


def _transformers(cfg: dict) -> dict:
    """The ``transformers`` child (see the module)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    # the modeling code imported: the load alone is timed
    MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(cfg["target"]))]
    t = clocks()
    hf = AutoModelForCausalLM.from_pretrained(cfg["target"], dtype=torch.bfloat16).eval()
    out: dict = {"load": since(t)}
    data = [tuple(s) for s in cfg["samples"]]
    with torch.inference_mode():
        t = clocks()
        hf(input_ids=torch.tensor([data[0][0] + data[0][1]]), output_hidden_states=True)
        out["first"] = since(t)
        best: dict = {}
        for _ in range(cfg["repeats"]):
            for i, (p, c) in enumerate(data):
                t = clocks()
                hf(input_ids=torch.tensor([p + c]), output_hidden_states=True)
                got = since(t)
                if i not in best or got["wall"] < best[i]["wall"]:
                    best[i] = got
    out["forward"] = [best[i] for i in range(len(data))]
    return out


def linear_shapes(folder: str) -> dict[str, list[tuple[int, int]]]:
    """The (out, in) of every matrix of each layer kind of the target, and of its head."""
    from remote.eval.target import describe

    _c, meta, info = describe(folder)
    layers = meta.get_submodule(info.layers_path)
    kinds = info.layer_types or ["full_attention"] * info.num_layers
    out: dict[str, list[tuple[int, int]]] = {}
    for kind, layer in zip(kinds, layers, strict=True):
        mats = [tuple(p.shape) for p in layer.parameters() if p.dim() == 2]
        out.setdefault(kind, mats)
    out["head"] = [tuple(meta.get_submodule(info.head_path).weight.shape)]
    return out


def _gemm(cfg: dict) -> dict:
    """The ``gemm`` child: per layer kind and the head, the best (wall, CPU) of bf16
    ``F.linear`` at each sample's rows, summed over the samples; multiplied as the engine
    multiplies on this CPU (`remote.eval.cpu_bf16`: in float32 where torch has no bf16
    kernels, whose fallback runs far below the CPU's speed)."""
    import torch

    from remote.eval.cpu_bf16 import policy
    from remote.eval.device import computing

    # without autograd, as the eval runs: the engine's widening reuses its buffer then
    with computing(torch.device("cpu")), torch.inference_mode():
        return {"policy": policy(), **_gemms(cfg)}


def _gemms(cfg: dict) -> dict:
    import torch
    import torch.nn.functional as F

    out: dict = {}
    rows = {"head": [len(c) + 1 for _p, c in cfg["samples"]]}
    tokens = [len(p) + len(c) for p, c in cfg["samples"]]
    for kind, mats in cfg["shapes"].items():
        spent = {"wall": 0.0, "cpu": 0.0}
        for o, i in mats:
            w = torch.randn(o, i, dtype=torch.bfloat16) if o * i < 2**28 else _big(o, i)
            for m in rows.get(kind, tokens):
                x = torch.randn(m, i, dtype=torch.bfloat16)
                F.linear(x, w)
                best = None
                for _ in range(cfg["repeats"] + 1):
                    t = clocks()
                    F.linear(x, w)
                    got = since(t)
                    best = got if best is None or got["wall"] < best["wall"] else best
                spent = {k: spent[k] + best[k] for k in spent}
            del w
        out[kind] = spent
    return out


def _big(o: int, i: int):
    """A random bf16 [o, i] matrix made a slice at a time (no float32 copy of it all)."""
    import torch

    w = torch.empty(o, i, dtype=torch.bfloat16)
    for a in range(0, o, 8192):
        w[a : a + 8192] = torch.randn(min(8192, o - a), i)
    return w


CHILDREN = {"engine": _engine, "transformers": _transformers, "gemm": _gemm}


def child(argv: list[str]) -> None:
    """A child's entry: ``argv`` = [name, JSON config]; prints its JSON line."""
    import torch

    name, cfg = argv[0], json.loads(argv[1])
    torch.set_num_threads(cfg["threads"])
    print("RESULT " + json.dumps(CHILDREN[name](cfg)), flush=True)


if __name__ == "__main__":
    child(sys.argv[1:])
