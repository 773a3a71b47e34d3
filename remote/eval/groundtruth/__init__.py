"""Ground truth for the offline walk, made on the eval host as a job's first phase and cached
(docs/eval.md; its modules: docs/architecture.md). Re-exports the names other modules use."""

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
