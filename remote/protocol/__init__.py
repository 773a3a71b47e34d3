"""What the controller (`orchestrator/`) and a host (`remote/`) must agree on, defined ONCE.

Standard library only: the controller imports this package without torch, and a host runs
it inside the bundle. Both sides validate what they receive with the same functions, so a
value the controller accepts is one the host accepts, in the same words. Everyone imports
it as `remote.protocol`; its modules hold the parts:

- the relay's names on a host (`MANIFEST`, `PARTIAL_PREFIX`, `REPAIR_PREFIX`) and its frame
  format on the wire (`FRAME_HEADER`: an 8-byte big-endian length before each payload),
  defined in `remote.relay.wire` and re-exported here;
- `schemas`: the schema names of the documents that cross (`JOB_SPEC_SCHEMA`,
  `RESULT_SCHEMA`, `PROBE_SCHEMA`, `MANIFEST_FORMAT`) and the files a job sends back;
- `results`: the JSON types of an eval's result files (``result.json``, ``spec.json``,
  ``ground_truth.json``, ``samples.jsonl``): `check_files` on what a host sends, the
  others on what a run folder holds;
- `job_spec`: the job document, typed (`JobSpec`: its blocks and settings, each checked
  by the contract's own `Check`);
- `jobs`: job ids, states and kinds, carried files, the JSON types of a host's answers,
  how the scheduler ended a Slurm task's attempt (`check_slurm_end`);
- `gt_sources`: the ground truth's source kinds, each once (`GTKind`, `GT_SOURCES`: what
  a job names for it, what it does with the prompts);
- `ground_truth`: the job's `GroundTruthSpec` (with its bounds, `GTLimits`), the
  suspect-agreement rule;
- `sampling`: how the ground truth is decoded (`Sampling`: greedy by default, or sampled
  at a temperature with top-k, top-p, a seed and completions per prompt), the draft
  policies, each completion's seed and the check of what a server says it sampled;
- `eval_spec`: `EvalSpec`, what the eval engine evaluates and how, with ONE dtype
  vocabulary (``bfloat16``/``float32``; ``bf16``/``fp32`` are accepted once, at parse) and
  one set of defaults. A bad value is a `SpecError` (a ValueError with one line saying what
  to do); each side turns it into its own user error;
- `prompts`: a prompts file (JSONL) as both sides read it (`parse_prompts`);
- `ladder`: a context ladder's rungs (``context_ladder``), parsed and bounded once;
- `context`: rounds placed by context position, the buckets and the cliff finder;
- `metrics`: the metric registry, every number an eval reports defined once (its name,
  how samples combine, how it prints), imported as `remote.protocol.metrics`;
- `values`: the one vocabulary of value types (`Check`: `COUNT`, `FLAG`, `one_of`,
  `list_of`, ...) that the job document, the result files and the job answers are checked
  with, what a whole number is, how a bad value is shown.
"""

from __future__ import annotations

from remote.protocol.eval_spec import DEFAULT_BUDGETS as DEFAULT_BUDGETS
from remote.protocol.eval_spec import DEFAULT_DTYPE as DEFAULT_DTYPE
from remote.protocol.eval_spec import DEVICE_RE as DEVICE_RE
from remote.protocol.eval_spec import DTYPE_ALIASES as DTYPE_ALIASES
from remote.protocol.eval_spec import DTYPES as DTYPES
from remote.protocol.eval_spec import ENGINE_PACKAGES as ENGINE_PACKAGES
from remote.protocol.eval_spec import JOB_ENGINE_DEFAULT as JOB_ENGINE_DEFAULT
from remote.protocol.eval_spec import POSITIONS as POSITIONS
from remote.protocol.eval_spec import EvalSpec as EvalSpec
from remote.protocol.eval_spec import parse_budgets as parse_budgets
from remote.protocol.eval_spec import parse_dtype as parse_dtype
from remote.protocol.ground_truth import GT_CACHE_KEY_RE as GT_CACHE_KEY_RE
from remote.protocol.ground_truth import GT_DEFAULT_CONCURRENCY as GT_DEFAULT_CONCURRENCY
from remote.protocol.ground_truth import GT_DEFAULT_DEADLINE as GT_DEFAULT_DEADLINE
from remote.protocol.ground_truth import GT_DEFAULT_MAX_NEW_TOKENS as GT_DEFAULT_MAX_NEW_TOKENS
from remote.protocol.ground_truth import GT_DEFAULT_PHASE_DEADLINE as GT_DEFAULT_PHASE_DEADLINE
from remote.protocol.ground_truth import GT_DEFAULT_TIMEOUT as GT_DEFAULT_TIMEOUT
from remote.protocol.ground_truth import GT_DEFERRED_FILE as GT_DEFERRED_FILE
from remote.protocol.ground_truth import GT_MAX_SECONDS as GT_MAX_SECONDS
from remote.protocol.ground_truth import GT_SUSPECT_AGREEMENT as GT_SUSPECT_AGREEMENT
from remote.protocol.ground_truth import SECONDS as SECONDS
from remote.protocol.ground_truth import GroundTruthSpec as GroundTruthSpec
from remote.protocol.ground_truth import GTLimits as GTLimits
from remote.protocol.ground_truth import agreement_suspect as agreement_suspect
from remote.protocol.ground_truth import flag_suspect as flag_suspect
from remote.protocol.gt_sources import DEFAULT_SERVER_KIND as DEFAULT_SERVER_KIND
from remote.protocol.gt_sources import GT_KINDS as GT_KINDS
from remote.protocol.gt_sources import GT_SOURCES as GT_SOURCES
from remote.protocol.gt_sources import SERVER_KINDS as SERVER_KINDS
from remote.protocol.gt_sources import GTKind as GTKind
from remote.protocol.gt_sources import SourceKind as SourceKind
from remote.protocol.gt_sources import kind_for as kind_for
from remote.protocol.job_spec import ATTN as ATTN
from remote.protocol.job_spec import ATTN_IMPLEMENTATIONS as ATTN_IMPLEMENTATIONS
from remote.protocol.job_spec import CAPTURE_TOPK as CAPTURE_TOPK
from remote.protocol.job_spec import DEFAULT_WORKDIR as DEFAULT_WORKDIR
from remote.protocol.job_spec import FEATURE_CACHE_DEFAULT_GIB as FEATURE_CACHE_DEFAULT_GIB
from remote.protocol.job_spec import FEATURE_CACHE_GIB as FEATURE_CACHE_GIB
from remote.protocol.job_spec import LAYERS as LAYERS
from remote.protocol.job_spec import STOP_AFTER as STOP_AFTER
from remote.protocol.job_spec import JobSpec as JobSpec
from remote.protocol.jobs import CARRY_DIRS as CARRY_DIRS
from remote.protocol.jobs import CARRY_MAX_BYTES as CARRY_MAX_BYTES
from remote.protocol.jobs import JOB_ANSWER_FIELDS as JOB_ANSWER_FIELDS
from remote.protocol.jobs import JOB_CARRY_KEY as JOB_CARRY_KEY
from remote.protocol.jobs import JOB_EVENT_FIELDS as JOB_EVENT_FIELDS
from remote.protocol.jobs import JOB_EXIT_FIELDS as JOB_EXIT_FIELDS
from remote.protocol.jobs import JOB_ID_RE as JOB_ID_RE
from remote.protocol.jobs import JOB_KINDS as JOB_KINDS
from remote.protocol.jobs import JOB_STATES as JOB_STATES
from remote.protocol.jobs import JOB_STATUS_FIELDS as JOB_STATUS_FIELDS
from remote.protocol.jobs import NAME_MAX_BYTES as NAME_MAX_BYTES
from remote.protocol.jobs import TERMINAL_STATES as TERMINAL_STATES
from remote.protocol.jobs import WATCH_END_EVENT as WATCH_END_EVENT
from remote.protocol.jobs import WATCH_HEARTBEAT_SECONDS as WATCH_HEARTBEAT_SECONDS
from remote.protocol.jobs import AnswerError as AnswerError
from remote.protocol.jobs import JobKind as JobKind
from remote.protocol.jobs import JobState as JobState
from remote.protocol.jobs import carried_name_problem as carried_name_problem
from remote.protocol.jobs import check_job_answer as check_job_answer
from remote.protocol.jobs import check_job_id as check_job_id
from remote.protocol.jobs import check_slurm_end as check_slurm_end
from remote.protocol.prompts import PROMPT_LINE_MAX_BYTES as PROMPT_LINE_MAX_BYTES
from remote.protocol.prompts import parse_prompts as parse_prompts
from remote.protocol.prompts import prompt_lines as prompt_lines
from remote.protocol.prompts import token_ids_only as token_ids_only
from remote.protocol.results import TARGET_COSTS as TARGET_COSTS
from remote.protocol.results import TARGET_LOADED_ENDS as TARGET_LOADED_ENDS
from remote.protocol.results import TARGET_LOADED_WHOLE as TARGET_LOADED_WHOLE
from remote.protocol.results import ResultError as ResultError
from remote.protocol.results import check_files as check_files
from remote.protocol.results import check_ground_truth as check_ground_truth
from remote.protocol.results import check_record as check_record
from remote.protocol.results import check_result as check_result
from remote.protocol.results import check_spec as check_spec
from remote.protocol.results import metrics_of as metrics_of
from remote.protocol.results import sample_labels as sample_labels
from remote.protocol.sampling import COMPLETION_KEYS as COMPLETION_KEYS
from remote.protocol.sampling import DEFAULT_DRAFT_POLICY as DEFAULT_DRAFT_POLICY
from remote.protocol.sampling import DRAFT_POLICIES as DRAFT_POLICIES
from remote.protocol.sampling import SAMPLING_KNOBS as SAMPLING_KNOBS
from remote.protocol.sampling import Sampling as Sampling
from remote.protocol.sampling import completion_id as completion_id
from remote.protocol.sampling import completion_keys as completion_keys
from remote.protocol.sampling import parse_temperatures as parse_temperatures
from remote.protocol.sampling import request_seed as request_seed
from remote.protocol.sampling import sampling_mismatch as sampling_mismatch
from remote.protocol.schemas import JOB_EVAL_KEY as JOB_EVAL_KEY
from remote.protocol.schemas import JOB_SPEC_SCHEMA as JOB_SPEC_SCHEMA
from remote.protocol.schemas import MANIFEST_FORMAT as MANIFEST_FORMAT
from remote.protocol.schemas import PARITY_CAPTURE_SCHEMA as PARITY_CAPTURE_SCHEMA
from remote.protocol.schemas import PARITY_SCHEMA as PARITY_SCHEMA
from remote.protocol.schemas import PROBE_SCHEMA as PROBE_SCHEMA
from remote.protocol.schemas import RESULT_FILES as RESULT_FILES
from remote.protocol.schemas import RESULT_SCHEMA as RESULT_SCHEMA
from remote.protocol.values import COUNT as COUNT
from remote.protocol.values import FLAG as FLAG
from remote.protocol.values import SHA256 as SHA256
from remote.protocol.values import TEXT as TEXT
from remote.protocol.values import WHOLE as WHOLE
from remote.protocol.values import Check as Check
from remote.protocol.values import SpecError as SpecError
from remote.protocol.values import finite as finite
from remote.protocol.values import is_int as is_int
from remote.protocol.values import is_number as is_number
from remote.protocol.values import json_type as json_type
from remote.protocol.values import one_of as one_of
from remote.protocol.values import shown as shown

# The relay's names on a host and its frame header live in remote.relay.wire (os and
# struct only, what the relay's host commands import instead of this package's dataclasses
# and typing: ~15 ms of each one's start); re-exported here, the same objects.
from remote.relay.wire import FRAME_HEADER as FRAME_HEADER
from remote.relay.wire import MANIFEST as MANIFEST
from remote.relay.wire import PARTIAL_PREFIX as PARTIAL_PREFIX
from remote.relay.wire import REPAIR_PREFIX as REPAIR_PREFIX
