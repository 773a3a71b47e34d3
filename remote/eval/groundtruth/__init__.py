"""Ground truth for the offline walk: each prompt's greedy completion by the target, as
token ids, made on the eval host as a job's first phase (`prepare`) and cached there. Its
sources, cache key, checks and bounds are described in docs/eval.md.

The modules: `prompts` (reading, selecting, rendering), `servers` (each server kind: how
it is asked, what its answer must hold, what it serves), `local` (generation with the
target), `checks` (what a completion, a file or an answer must be), `completions` (a job's
prompts as a source completes them, answers taken in prompt order), `cache` (the entries,
their key, `judge` after the eval) and `phase` (`prepare`, and each kind's source:
`SOURCES`). The names other modules use are re-exported here.
"""

from remote.eval.groundtruth.cache import judge as judge
from remote.eval.groundtruth.cache import judge_job as judge_job
from remote.eval.groundtruth.cache import target_identity as target_identity
from remote.eval.groundtruth.checks import read_ground_truth_file as read_ground_truth_file
from remote.eval.groundtruth.checks import retokenisation_check as retokenisation_check
from remote.eval.groundtruth.phase import prepare as prepare
from remote.eval.groundtruth.prompts import load_prompts as load_prompts
from remote.eval.groundtruth.prompts import load_tokenizer as load_tokenizer
from remote.eval.groundtruth.prompts import render_prompt as render_prompt
from remote.eval.groundtruth.prompts import select as select
from remote.httpclient import http_json as http_json
from remote.httpclient import reachable as reachable
