"""What does a bfloat16 product cost on a CPU without bfloat16 kernels, each way the
engine could take it: a fresh float32 copy of the weight, the earlier cache-sized slices
(``x @ w.T``), the engine's way now (`remote.eval.cpu_bf16.linear`), torch's own bfloat16
kernel, or float32 weights kept whole?

    python benchmarks/widen_buffer.py [--rows 1,2,4,16,64,256] [--repeats 5] [--threads 1]

Setup: a Qwen3.6-27B MLP matrix (17408 x 5120), its down projection (5120 x 17408) and
one 64M-element slice of its 248320-row head (13107 x 5120), bf16, random. Measured in ONE
run, modes interleaved, under `torch.inference_mode` (as the eval runs), median of
``--repeats`` per mode, at each row count (1-4: a lone sample's head rows and decode
steps; 16: a block's verify or a drafter block; 256: the walk's chunk):

* ``fresh``: ``F.linear(x.float(), w.float())``, a new float32 copy per product;
* ``x@wT``: the weight widened a `SLICE_ELEMENTS` slice at a time into the reused buffer,
  each slice's product ``F.linear(x, slice)`` (the engine's way before this one);
* ``engine``: `remote.eval.cpu_bf16.linear` as the engine runs it: torch's own kernel up
  to `NATIVE_ROWS` rows, else each widened slice's product as ``slice @ x.T``;
* ``native``: torch's own bfloat16 kernel at every row count;
* ``float32``: the product on float32 weights kept whole (no widening; 2x the memory,
  which the engine does not spend).

Prints each time, engine / x@wT, engine / native and engine / float32 per shape and row
count, and how many elements of the engine's product differ from x@wT's (only the order
of the float32 sums differs: a few elements in a thousand, each one bfloat16 step).
"""

from __future__ import annotations

import argparse
from functools import partial

from common.measure import interleave, load_avg, loads

SHAPES = {
    "mlp 17408x5120": (17408, 5120),
    "down 5120x17408": (5120, 17408),
    "head slice 13107x5120": (13107, 5120),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,16,64,256")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    from remote.eval import cpu_bf16

    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    print(
        f"setup: torch {torch.__version__}, CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, bf16 kernels "
        f"{cpu_bf16.native_supported()}; threads {args.threads}; median of {args.repeats}"
    )
    load = load_avg()
    ratios: dict[str, list[float]] = {"x@wT": [], "native": []}
    with torch.inference_mode():
        for label, (o, i) in SHAPES.items():
            w = torch.randn(o, i).to(torch.bfloat16)
            kept = w.float()
            for m in rows:
                t, differ = measure(w, kept, torch.randn(m, i).to(torch.bfloat16), args.repeats)
                for base, got in ratios.items():
                    got.append(t["engine"] / t[base])
                print(
                    f"  {label:22s} rows {m:4d}: "
                    + "  ".join(f"{k} {v:7.3f} s" for k, v in t.items())
                    + f"   engine/x@wT {t['engine'] / t['x@wT']:5.2f}x  engine/native "
                    f"{t['engine'] / t['native']:5.2f}x  engine/float32 "
                    f"{t['engine'] / t['float32']:5.2f}x  elements off x@wT's {differ}",
                    flush=True,
                )
            del w, kept
    print(loads(load))
    print(
        "widen_buffer: "
        + "; ".join(f"engine/{k} {min(v):.2f}-{max(v):.2f}x" for k, v in ratios.items())
        + f"; {len(ratios['native'])} cases"
    )


def measure(w, kept, x, repeats: int) -> tuple[dict[str, float], int]:
    """Median seconds of each mode on `x`; the elements where the engine's product differs
    from x@wT's."""
    import torch
    import torch.nn.functional as F

    from remote.eval import cpu_bf16

    products = {
        "fresh": lambda: F.linear(x.float(), w.float()).to(torch.bfloat16),
        "x@wT": lambda: x_wt(x, w),
        "engine": lambda: cpu_bf16.linear(x, w),
        "native": lambda: F.linear(x, w),
        "float32": lambda: F.linear(x.float(), kept).to(torch.bfloat16),
    }
    modes = {name: partial(discard, p) for name, p in products.items()}
    differ = int((products["engine"]() != products["x@wT"]()).sum())
    for run in modes.values():  # warm-up, untimed
        run()
    got = interleave(modes, repeats)
    return {name: got.median(name) for name in modes}, differ


def x_wt(x, w):
    """The engine's product before this one: each widened slice's ``F.linear(x, slice)``."""
    import torch
    import torch.nn.functional as F

    from remote.eval import cpu_bf16

    xf = x.float()
    out = torch.empty((*x.shape[:-1], w.shape[0]), dtype=torch.bfloat16)
    step = max(1, cpu_bf16.SLICE_ELEMENTS // w.shape[1])
    for start in range(0, w.shape[0], step):
        end = min(start + step, w.shape[0])
        out[..., start:end] = F.linear(xf, cpu_bf16.widen(w[start:end]))
    return out


def discard(product) -> None:
    """`product`'s result dropped: a timed mode returns its own figures or None."""
    product()


if __name__ == "__main__":
    main()
