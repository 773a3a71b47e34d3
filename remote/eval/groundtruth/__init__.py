"""Ground truth for the offline walk: each prompt's GREEDY completion by the target, as ids.

Runs on the eval host, as a job's first phase, because the serving engine usually listens
on the host's own loopback. Sources (``spec["ground_truth"]["kind"]``):

- ``sglang``: SGLang's native ``POST /generate`` with ``input_ids`` and
  ``sampling_params {temperature: 0, max_new_tokens}``; the answer's ``output_ids``.
- ``openai``: an OpenAI-compatible ``POST /v1/completions`` whose ``prompt`` is the list of
  token ids and which returns ids when asked (``return_token_ids: true``, as vLLM >= 0.10.2
  and SGLang offer): ``choices[0].token_ids``.
- ``openai-text``: a text-only OpenAI-compatible server (``transformers serve``, ...). Text
  is not ids: decode-then-encode does not always round-trip. Accepted with a loud warning;
  the completion is retokenised with the target's tokenizer and every sample is checked
  (see `retokenisation_check`); the mismatch rate is recorded with the result.
- ``file``: a JSONL file already holding ``{"id", "prompt_ids", "completion_ids"}`` lines.
- ``local``: greedy generation on this host with the target itself (slow for big models),
  ``concurrency`` prompts per ``generate`` call (left-padded and masked, as a serving engine
  batches requests; 1: one prompt at a time).

Prompts are JSONL, z-lab's ``{"turns": [...]}`` (the first turn is the user message) or
``{"prompt": "..."}``; the target's chat template is applied (``thinking`` on or off).
``samples`` picks that many prompts with a seeded RNG, in file order.

Requests to a server go out concurrently, up to ``spec["ground_truth"]["concurrency"]``
(default 16) in flight at once, because serving engines batch concurrent requests; answers
are taken, checked and recorded in prompt order, so the result is the serial one.

The result is cached in ``<workdir>/groundtruth/<key>.jsonl`` where ``key`` hashes the
target's identity (its path, config and weight files' sizes), the exact prompt ids (so
the prompt file, the selection, the template and the thinking flag are all in it), the
sampling parameters, the kind of source and, for a server, its URL and the model it serves
as it reports it (SGLang ``GET /get_model_info`` -> ``model_path``; OpenAI-compatible
``GET /v1/models`` -> ``id`` and ``root``): the next checkpoint evaluated against the same
prompts and the same server reuses it, another server or model never does. Every
completion is validated (integer ids inside the target's vocabulary, non-empty, at most
``max_new_tokens``) BEFORE anything is cached, so a bad server's answer is refused in one
line and never reused; a cache entry that fails the same checks is ignored. The info
returned (and recorded in the result) says whether the ground truth came from the cache and
which source made it (``source``: kind, URL, model, time).

Only greedy decoding is accepted: a ground truth sampled at temperature > 0 is not what
speculative decoding with greedy verification reproduces. A server whose answer reports
non-greedy sampling parameters is refused the same way.

A server is its own trust domain. Every wait on it is bounded (`remote.protocol.GTLimits`):
``timeout`` seconds of silence on one read, ``deadline`` seconds per request however it
trickles, ``phase_deadline`` for the whole phase (local generation too); an answer is read
only up to what a valid one can take (`answer_bytes`) before it is parsed; a redirect is
refused, never followed. After the eval, `judge` weighs the target's agreement with the
ground truth: one it disagrees with wholesale is flagged and leaves the cache. ``fresh``
in the job's ``ground_truth`` remakes an entry on purpose.

The modules, by what they do: `prompts` (reading, selecting, rendering), `client` (the one
HTTP client, its bounds), `servers` (each server kind's request), `local` (generation with
the target), `checks` (what a completion, a file or an answer must be), `cache` (the
entries, their key, `judge` after the eval) and `phase` (`prepare`: one function per
source kind). The names other modules use are re-exported here.
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
