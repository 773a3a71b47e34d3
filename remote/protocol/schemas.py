"""The names of the documents that cross between the controller and a host, and the files a
finished job sends back."""

from __future__ import annotations

MANIFEST_FORMAT = "dflash-manifest/1"
JOB_SPEC_SCHEMA = "dflash.job/1"  # the engine's EvalSpec travels in it under JOB_EVAL_KEY
JOB_EVAL_KEY = "eval"
RESULT_SCHEMA = "dflash.eval/1"
PROBE_SCHEMA = "dflash.probe/1"
PARITY_SCHEMA = "dflash.parity/1"  # the compare job's result.json
PARITY_CAPTURE_SCHEMA = "dflash.parity-capture/1"  # one host's capture, A to B over the relay
# Files a finished job leaves in its folder that travel back with its result (the only
# names the controller writes).
RESULT_FILES = (
    "result.json",
    "samples.jsonl",
    "spec.json",
    "eval_spec.json",
    "ground_truth.json",
    "exit.json",
    "events.jsonl",
    "log.txt",
    "verdict.json",  # an online job's: offline beside online (remote.online.verdict)
    "server.log",  # an online job's: the serving engine's own log
    "baseline.log",  # an online job's with a baseline: that server's own log
)

# Small input files a job start carries inside its spec (under JOB_CARRY_KEY: a list of
# ``{"path", "sha256", "data"}``, data base64), so that pushing them costs no round trip of
