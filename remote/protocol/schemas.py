"""Names of the documents crossing between controller and host, and a job's result files."""

from __future__ import annotations

MANIFEST_FORMAT = "dflash-manifest/1"
JOB_SPEC_SCHEMA = "dflash.job/1"  # the engine's EvalSpec travels in it under JOB_EVAL_KEY
JOB_EVAL_KEY = "eval"
RESULT_SCHEMA = "dflash.eval/1"
PROBE_SCHEMA = "dflash.probe/1"
PARITY_SCHEMA = "dflash.parity/1"  # the compare job's result.json
PARITY_CAPTURE_SCHEMA = "dflash.parity-capture/1"  # one host's capture, A to B over the relay
# The only names the controller writes from a job's folder.
RESULT_FILES = (
    "result.json",
    "samples.jsonl",
    "spec.json",
    "eval_spec.json",
    "ground_truth.json",
    "exit.json",
    "events.jsonl",
    "log.txt",
    "verdict.json",  # an online job's, as the next two
    "server.log",
    "baseline.log",
    "engine_completions.jsonl",  # above temperature 0: the engine's, what was walked
)
