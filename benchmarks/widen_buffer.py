"""What does widening a bfloat16 weight to float32 cost per product, with a fresh float32
copy each time (as before) against the engine's reused buffer (`remote.eval.cpu_bf16`)?

    python benchmarks/widen_buffer.py [--rows 1,16,64,256] [--repeats 5] [--threads 1]

Setup: a Qwen3.6-27B MLP matrix (17408 x 5120) and one slice of its 248320-row head
(13107 x 5120, 64M elements: the most the engine widens at once), bf16, random. Measured
in ONE run, modes interleaved, under `torch.inference_mode` (as the eval runs), best of
``--repeats`` per mode, at each row count (1: a decode step; 16: a block's verify or a
drafter block; 256: the walk's chunk):

* ``fresh``: ``F.linear(x.float(), w.float())``, a new float32 copy per product (the
  engine's way before this benchmark);
* ``buffer``: `remote.eval.cpu_bf16.linear`, the weight widened into one reused buffer;
* ``float32``: the product on float32 weights kept whole (the floor: no widening; 2x the
  memory, which the engine does not spend).

Prints each time, fresh / buffer and buffer / float32 per shape and row count, and the
products' equality (the buffer's result must be the fresh one's, bit for bit).
"""

from __future__ import annotations

import argparse
from functools import partial

from common.measure import interleave, load_avg, loads

SHAPES = {"mlp 17408x5120": (17408, 5120), "head slice 13107x5120": (13107, 5120)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,16,64,256")
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
        f"{cpu_bf16.native_supported()}; threads {args.threads}; best of {args.repeats}"
    )
    load = load_avg()
    ratios: list[float] = []
    with torch.inference_mode():
        for label, (o, i) in SHAPES.items():
            w = torch.randn(o, i).to(torch.bfloat16)
            kept = w.float()
            for m in rows:
                f, b, k, same = measure(w, kept, torch.randn(m, i).to(torch.bfloat16), args.repeats)
                ratios.append(f / b)
                print(
                    f"  {label:22s} rows {m:4d}: fresh {f:7.3f} s  buffer {b:7.3f} s  float32 "
                    f"{k:7.3f} s   fresh/buffer {f / b:5.2f}x  buffer/float32 {b / k:5.2f}x"
                    f"  same product {same}",
                    flush=True,
                )
            del w, kept
    print(loads(load))
    print(f"widen_buffer: fresh/buffer {min(ratios):.2f}-{max(ratios):.2f}x, {len(ratios)} cases")


def measure(w, kept, x, repeats: int) -> tuple[float, float, float, bool]:
    """Best seconds of the three modes on `x` and whether fresh and buffer agree exactly."""
    import torch
    import torch.nn.functional as F

    from remote.eval import cpu_bf16

    products = {
        "fresh": lambda: F.linear(x.float(), w.float()).to(torch.bfloat16),
        "buffer": lambda: cpu_bf16.linear(x, w),
        "float32": lambda: F.linear(x.float(), kept).to(torch.bfloat16),
    }
    modes = {name: partial(discard, p) for name, p in products.items()}
    same = torch.equal(products["fresh"](), products["buffer"]())
    for run in modes.values():  # warm-up, untimed
        run()
    got = interleave(modes, repeats)
    return (*(got.best(name) for name in modes), same)


def discard(product) -> None:
    """`product`'s result dropped: a timed mode returns its own figures or None."""
    product()


if __name__ == "__main__":
    main()
