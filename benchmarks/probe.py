"""Probe a 27B-scale Qwen3.5 VLM config (modelled on Qwen3.6-27B) with no weights on disk.

Prints the probe's wall seconds and peak RSS next to the bytes a full load would need, as a
ratio. The probe runs in a child process (``python -m remote probe``) so its peak RSS is its
own, measured with ``resource.getrusage(RUSAGE_CHILDREN)``; the baseline is the imports alone
(``python -c 'import torch, transformers'``) measured the same way in the same run.

    python benchmarks/probe.py
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CONFIG = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "dtype": "bfloat16",
    "image_token_id": 248056,
    "video_token_id": 248057,
    "vision_start_token_id": 248053,
    "vision_end_token_id": 248054,
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_5_text",
        "vocab_size": 248320,
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": 64,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 16,
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        "dtype": "bfloat16",
    },
    "vision_config": {
        "depth": 27,
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "num_heads": 16,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 5120,
        "num_position_embeddings": 2304,
    },
}


def child_peak_rss(argv: list[str]) -> tuple[float, int, str]:
    """(wall seconds, peak RSS bytes, stdout) of one child process run alone."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.run(
        argv, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(proc.stderr)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # ru_maxrss of children is the max over all children so far: run the heavier one second
    # or read it per run (ours: baseline first, then the probe, which is the larger).
    return wall, max(peak, before) * 1024, proc.stdout


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "qwen3.6-27b-config-only"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(CONFIG))
        base_wall, base_rss, _ = child_peak_rss(
            [sys.executable, "-c", "import torch, transformers, safetensors"]
        )
        wall, rss, out = child_peak_rss(
            [sys.executable, "-m", "remote", "probe", "--model", str(folder), "--depth", "3"]
        )
    report = json.loads(out)
    p = report["parameters"]
    full = p["total"]["bytes"]
    text = p["text"]["bytes"]
    gib = 1024**3
    print(
        f"model: {report['built_class']}, {report['text']['num_layers']} layers at "
        f"{report['text']['layers']}, hidden {report['text']['hidden_size']}, "
        f"{report['text']['layer_types_config']}"
    )
    print(
        f"params: total {p['total']['params'] / 1e9:.2f} "
        f"B, text {p['text']['params'] / 1e9:.2f} B, "
        f"vision {p['vision']['params'] / 1e9:.3f} B"
    )
    print(
        f"bytes a full load needs ({report['dtype']}): "
        f"{full / gib:.2f} GiB; text-only: {text / gib:.2f} GiB"
    )
    print(
        f"baseline (import torch+transformers): {base_wall:.2f} "
        f"s, peak RSS {base_rss / 2**20:.0f} MiB"
    )
    print(
        f"probe: {wall:.2f} s wall (inside: {report['probe_seconds']:.2f} s), "
        f"peak RSS {rss / 2**20:.0f} MiB"
    )
    print(f"peak RSS / full-load bytes: {rss / full:.4f}  (1/{full / rss:.0f})")
    print(f"probe peak RSS over import baseline: {(rss - base_rss) / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
