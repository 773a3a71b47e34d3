"""Build the built-in z-lab prompt sets (gsm8k, math500, humaneval, mbpp) from their
upstream files, as z-lab/dflash's benchmark evaluates them.

Run by hand when a set is rebuilt, never at test time; what it read and wrote is recorded
in orchestrator/data/prompts/SOURCES.md. Each prompt is formatted as z-lab's
``load_and_process_dataset`` formats it (the instruction suffix included), and a set
larger than z-lab's sample count keeps the prompts z-lab's benchmark ran:
``dataset.shuffle(seed=0).select(range(max_samples))`` of Hugging Face ``datasets``, which is
``numpy.random.default_rng(0).permutation(n)[:max_samples]``, in that order.

    python3 scripts/build_zlab_prompts.py GSM8K_TEST_JSONL MATH500_TEST_JSONL \
        HUMANEVAL_JSONL_GZ SANITIZED_MBPP_JSON OUT_DIR
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np

# z-lab's --max-samples per set (run_benchmark.sh): humaneval's 164 are all it has.
SAMPLES = {"gsm8k": 128, "math500": 128, "humaneval": 164, "mbpp": 128}
BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL = (
    "Write a solution to the following problem and make sure that it passes the tests:\n"
    "```python\n{prompt}\n```"
)


def zlab_subset(rows: list[dict], name: str) -> list[dict]:
    """The rows z-lab's benchmark evaluates of set `name`: all when there are at most its
    `SAMPLES`, else the first `SAMPLES` of Hugging Face's ``shuffle(seed=0)``."""
    n = SAMPLES[name]
    if len(rows) <= n:
        return rows
    return [rows[i] for i in np.random.default_rng(0).permutation(len(rows))[:n]]


def jsonl(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def gsm8k(path: str) -> list[dict]:
    rows = [{"n": n, **r} for n, r in enumerate(jsonl(path))]
    return [
        {"id": f"gsm8k-{r['n']}", "category": "gsm8k", "prompt": r["question"] + BOXED}
        for r in zlab_subset(rows, "gsm8k")
    ]


def math500(path: str) -> list[dict]:
    out = []
    for r in zlab_subset(jsonl(path), "math500"):
        # unique_id is test/<subject folder>/<n>.json; the folder names the subject in the
        # letters a label allows ("Counting & Probability" -> counting_and_probability).
        _, subject, number = r["unique_id"].removesuffix(".json").split("/")
        out.append(
            {
                "id": f"math500-{subject}-{number}",
                "category": "math500",
                "subcategory": subject,
                "prompt": r["problem"] + BOXED,
            }
        )
    return out


def humaneval(path: str) -> list[dict]:
    rows = [json.loads(line) for line in gzip.open(path, "rt") if line.strip()]
    return [
        {
            "id": "humaneval-" + r["task_id"].split("/")[1],
            "category": "humaneval",
            "prompt": HUMANEVAL.format(prompt=r["prompt"]),
        }
        for r in zlab_subset(rows, "humaneval")
    ]


def mbpp(path: str) -> list[dict]:
    # The Hugging Face "sanitized" config's test split: task ids 11-510, in file order.
    rows = [r for r in json.loads(Path(path).read_text()) if 11 <= r["task_id"] <= 510]
    return [
        {"id": f"mbpp-{r['task_id']}", "category": "mbpp", "prompt": r["prompt"]}
        for r in zlab_subset(rows, "mbpp")
    ]


def main(argv: list[str]) -> None:
    gsm, math, human, sanitized, out = argv
    for name, rows in (
        ("gsm8k", gsm8k(gsm)),
        ("math500", math500(math)),
        ("humaneval", humaneval(human)),
        ("mbpp", mbpp(sanitized)),
    ):
        text = "".join(json.dumps(r) + "\n" for r in rows)
        Path(out, f"{name}.jsonl").write_text(text)
        print(f"{name}: {len(rows)} prompts")


if __name__ == "__main__":
    main(sys.argv[1:])
