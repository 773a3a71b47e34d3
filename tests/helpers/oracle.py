"""The reference the eval engine is measured against: online greedy speculative decoding
(`orchestrator.demo.oracle`, the one loop the benchmarks time too), under the names the
tests import."""

from orchestrator.demo.oracle import cache_kwarg as cache_kwarg
from orchestrator.demo.oracle import features as features
from orchestrator.demo.oracle import hf_model as hf_model
from orchestrator.demo.oracle import online_rounds as online_rounds
