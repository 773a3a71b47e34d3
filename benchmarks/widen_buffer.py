"""What does widening a bfloat16 weight to float32 cost per product: a fresh float32 copy
each time, one reused buffer holding the whole weight, or the engine's reused buffer a
cache-sized slice at a time (`remote.eval.cpu_bf16`)?

    python benchmarks/widen_buffer.py [--rows 1,16,64,256] [--repeats 5] [--threads 1]

Setup: a Qwen3.6-27B MLP matrix (17408 x 5120), its down projection (5120 x 17408) and
one 64M-element slice of its 248320-row head (13107 x 5120), bf16, random. Measured in ONE
run, modes interleaved, under `torch.inference_mode` (as the eval runs), best of
``--repeats`` per mode, at each row count (1: a decode step; 16: a block's verify or a
drafter block; 256: the walk's chunk):

* ``fresh``: ``F.linear(x.float(), w.float())``, a new float32 copy per product (the
  engine's way before a buffer);
* ``whole``: `remote.eval.cpu_bf16.linear` with 64M-element slices (the engine's way
  before cache-sized slices): each weight here widened whole into the reused buffer;
* ``slices``: `remote.eval.cpu_bf16.linear` as the engine runs it, a `SLICE_ELEMENTS`
  slice at a time into the reused buffer;
* ``float32``: the product on float32 weights kept whole (the floor: no widening; 2x the
  memory, which the engine does not spend).

Prints each time, fresh / whole, slices / whole and slices / float32 per shape and row
count, and the products' equality (fresh and whole must agree bit for bit; slices may
differ from them where the float32 sums' order does, a few elements in millions).
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
WHOLE = 64 << 20  # the slice before cache-sized ones


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
                t, differ = measure(w, kept, torch.randn(m, i).to(torch.bfloat16), args.repeats)
                ratios.append(t["slices"] / t["whole"])
                print(
                    f"  {label:22s} rows {m:4d}: "
                    + "  ".join(f"{k} {v:7.3f} s" for k, v in t.items())
                    + f"   fresh/whole {t['fresh'] / t['whole']:5.2f}x  slices/whole "
                    f"{ratios[-1]:5.2f}x  slices/float32 {t['slices'] / t['float32']:5.2f}x"
                    f"  slices' elements off the whole's {differ}",
                    flush=True,
                )
            del w, kept
    print(loads(load))
    print(f"widen_buffer: slices/whole {min(ratios):.2f}-{max(ratios):.2f}x, {len(ratios)} cases")


def measure(w, kept, x, repeats: int) -> tuple[dict[str, float], int]:
    """Best seconds of each mode on `x`; the elements where slices' product differs from
    the whole weight's. Stops if fresh and whole differ."""
    import torch
    import torch.nn.functional as F

    from remote.eval import cpu_bf16

    def whole():
        sliced, cpu_bf16.SLICE_ELEMENTS = cpu_bf16.SLICE_ELEMENTS, WHOLE
        try:
            return cpu_bf16.linear(x, w)
        finally:
            cpu_bf16.SLICE_ELEMENTS = sliced

    products = {
        "fresh": lambda: F.linear(x.float(), w.float()).to(torch.bfloat16),
        "whole": whole,
        "slices": lambda: cpu_bf16.linear(x, w),
        "float32": lambda: F.linear(x.float(), kept).to(torch.bfloat16),
    }
    modes = {name: partial(discard, p) for name, p in products.items()}
    if not torch.equal(products["fresh"](), products["whole"]()):
        raise SystemExit("the whole buffer's product differs from a fresh copy's")
    differ = int((products["slices"]() != products["whole"]()).sum())
    for run in modes.values():  # warm-up, untimed
        run()
    got = interleave(modes, repeats)
    return {name: got.best(name) for name in modes}, differ


def discard(product) -> None:
    """`product`'s result dropped: a timed mode returns its own figures or None."""
    product()


if __name__ == "__main__":
    main()
