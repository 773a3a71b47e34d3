"""Online acceptance without a server: what vLLM answers, checked field by field
(`remote.online.vllm`, `remote.online.counters`): malformed answers refused, impossible
counts kept as invalid naming the field; and the engine's own decode time (the verdict:
tests/test_online_verdict.py). The texts below are vLLM 0.32's own shapes, copied from a real
server's answers (tests/test_online_vllm.py runs that server)."""

from __future__ import annotations

import copy

import pytest

from remote.errors import UserError
from remote.online import verdict
from remote.online.counters import Counters, spec_counters
from remote.online.vllm import parse_completion

WHERE = "http://127.0.0.1:8000/v1/completions"
METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="/m"} 53.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="/m"} 1.7961541784964228e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="/m"} 159.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="/m"} 66.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="0"} 33.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="1"} 17.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="2"} 16.0
http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 3.0
"""
ANSWER = {
    "id": "cmpl-a02ddae2b48bc096",
    "object": "text_completion",
    "choices": [
        {
            "index": 0,
            "text": "",
            "finish_reason": "length",
            "token_ids": [268, 268, 268, 104, 104, 104],
            "prompt_token_ids": [22, 207, 229],
        }
    ],
    "metrics": {
        "time_to_first_token_ms": None,
        "speculative_decoding": {
            "mean_acceptance_length": 2.5,
            "draft_acceptance_rate": 0.5,
            "acceptance_histogram": [1, 0, 0, 1],
            "num_spec_steps": 2,
            "num_accepted_draft_tokens": 3,
            "num_draft_tokens": 6,
            "num_spec_tokens": 3,
            "per_step_accepted": [3, 0],
            "per_step_drafted": [3, 3],
        },
    },
}


def parse(answer=ANSWER, vocab=320, max_tokens=6):
    return parse_completion(answer, WHERE, [22, 207, 229], max_tokens, vocab)


def test_a_vllm_answer_gives_ids_and_per_step_acceptance():
    c = parse()
    assert c.token_ids == [268, 268, 268, 104, 104, 104] and c.finish_reason == "length"
    assert c.spec.accepted == [3, 0] and c.spec.drafted == [3, 3]
    assert (c.spec.steps, c.spec.num_accepted, c.spec.num_spec_tokens) == (2, 3, 3)


def _spoil(path: list, value):
    bad = copy.deepcopy(ANSWER)
    node = bad
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return bad


SPEC = ["metrics", "speculative_decoding"]


@pytest.mark.parametrize(
    "path, value, message",
    [
        (["choices", 0, "token_ids"], [268, 5000, 1, 1, 1, 1], "holds 5000, outside the target"),
        (["choices", 0, "token_ids"], [268, 268], "has 2 ids for max_tokens 6"),
        (["choices", 0, "token_ids"], "268", "is not a list of token ids"),
        (["choices", 0, "prompt_token_ids"], [1, 2], "differ from the prompt sent"),
        (["choices"], [], "without exactly one choice"),
        ([*SPEC, "acceptance_histogram"], [1, 0, 1], "not 4 counts"),
        ([*SPEC, "per_step_drafted"], [3], "per_step_drafted is not 2 integers"),
        ([*SPEC, "num_spec_steps"], "2", "num_spec_steps is '2', not an integer"),
        ([*SPEC, "num_spec_tokens"], True, "not a positive integer"),
        (["metrics"], [1], "metrics is list, not an object"),
    ],
)
def test_every_bad_field_is_one_line_naming_the_server_and_field(path, value, message):
    with pytest.raises(UserError) as err:
        parse(_spoil(path, value))
    line = str(err.value)
    assert "\n" not in line and line.startswith(WHERE) and message in line


@pytest.mark.parametrize(
    "path, value, field, message",
    [
        ([*SPEC, "num_spec_steps"], 3, "num_spec_steps", "is 3 but its histogram says 2"),
        ([*SPEC, "num_draft_tokens"], 2, "num_draft_tokens", "outside 3..6"),
        ([*SPEC, "mean_acceptance_length"], 3.0, "mean_acceptance_length", "is 3.0"),
        ([*SPEC, "per_step_accepted"], [3, 1], "per_step_accepted", "disagree with its totals"),
        ([*SPEC, "per_step_drafted"], [2, 3], "per_step_accepted", "step 0 accepted 3 of 2"),
        ([*SPEC, "acceptance_histogram"], [1, 0, -1, 2], "acceptance_histogram", "[1, 0, -1, 2]"),
    ],
)
def test_impossible_counts_are_kept_as_invalid_naming_the_field(path, value, field, message):
    """Counts that cannot be true are not a failed request: the ids are read, the counts
    are not, and the answer carries one line naming the field (the verdict's
    engine_answer_invalid)."""
    c = parse(_spoil(path, value))
    assert c.spec is None and c.token_ids == ANSWER["choices"][0]["token_ids"]
    assert c.invalid.field == f"metrics.speculative_decoding.{field}"
    line = str(c.invalid)
    assert "\n" not in line and line.startswith(WHERE) and message in line


def _impossible(steps: int, accepted: int, tokens: int, per_step: bool = True) -> dict:
    """An answer of `steps` verify steps each accepting `accepted` of 3 drafts for
    `tokens` output tokens."""
    answer = copy.deepcopy(ANSWER)
    answer["choices"][0]["token_ids"] = [7] * tokens
    spec = answer["metrics"]["speculative_decoding"]
    hist = [0, 0, 0, 0]
    hist[accepted] = steps
    spec.update(
        acceptance_histogram=hist,
        num_spec_steps=steps,
        num_accepted_draft_tokens=steps * accepted,
        num_draft_tokens=3 * steps,
        mean_acceptance_length=1.0 + accepted,
        per_step_accepted=[accepted] * steps if per_step else None,
        per_step_drafted=[3] * steps if per_step else None,
    )
    return answer


def test_steps_the_output_cannot_hold_are_invalid():
    """The issue's server: 15 verify steps each accepting 3 draft tokens for 16 output
    tokens (they would emit 60); with the per-step arrays and from the totals alone."""
    c = parse(_impossible(15, 3, 16), max_tokens=16)
    assert c.spec is None
    assert c.invalid.field == "metrics.speculative_decoding.per_step_accepted"
    assert "15 verify steps accepting 45 draft tokens for 16 output tokens is impossible" in str(
        c.invalid
    )
    c = parse(_impossible(15, 3, 16, per_step=False), max_tokens=16)
    assert c.invalid.field == "metrics.speculative_decoding.num_accepted_draft_tokens"
    # what vLLM does answer: the last step runs past max_tokens (counted, not output)
    assert parse(_impossible(4, 3, 14), max_tokens=14).invalid is None
    assert parse(_impossible(5, 3, 14), max_tokens=14).invalid is not None


def test_a_missing_spec_field_names_it():
    bad = copy.deepcopy(ANSWER)
    del bad["metrics"]["speculative_decoding"]["num_draft_tokens"]
    with pytest.raises(UserError, match="lacks num_draft_tokens"):
        parse(bad)


def test_an_answer_without_spec_metrics_has_none():
    bare = copy.deepcopy(ANSWER)
    bare["metrics"] = None
    assert parse(bare).spec is None


def test_metrics_text_gives_the_spec_decode_counters():
    c = spec_counters(METRICS, "m")
    assert c == Counters(53, 159, 66, (33, 17, 16))
    assert spec_counters(METRICS, "m", model="/other") == Counters(0, 0, 0, ())
    later = Counters(60, 180, 70, (35, 18, 17))
    assert later.minus(c, "m") == Counters(7, 21, 4, (2, 1, 1))
    with pytest.raises(UserError, match="went backwards .* did the server restart"):
        c.minus(later, "m")


@pytest.mark.parametrize(
    "old, new, message",
    [
        ('position="2"} 16.0', 'position="2"} 15.0', "do not add up to 66"),
        ('position="2"} 16.0', 'position="two"} 16.0', "not a number"),
        ("} 159.0", "} 10.0", "66 accepted of 10 draft tokens"),
        ("} 53.0", "} 5.5", "not a whole count"),
        ("} 53.0", "} many", "not a number"),
        ('model_name="/m"} 53.0', 'model_name="/m} 53.0', "label set"),
        ("vllm:spec_decode_num_drafts_total{", "vllm:spec decode{", "not a Prometheus sample"),
    ],
)
def test_bad_metrics_are_one_line(old, new, message):
    with pytest.raises(UserError) as err:
        spec_counters(METRICS.replace(old, new, 1), "http://h/metrics")
    assert "\n" not in str(err.value) and message in str(err.value)
    assert str(err.value).startswith("http://h/metrics")


def test_label_values_unescape():
    text = 'vllm:spec_decode_num_drafts_total{model_name="a\\"b\\\\c"} 2\n'
    assert spec_counters(text, "m", model='a"b\\c').drafts == 2


def test_the_trainer_makes_drafters_with_heads_vllm_cpu_takes():
    from types import SimpleNamespace

    from orchestrator.demo.train import drafter_config

    info = SimpleNamespace(hidden_size=128, vocab_size=320, num_layers=6)
    cfg = drafter_config(info, mask_token_id=3, block_size=4, num_layers=2, target_layer_ids=[1])
    assert cfg["head_dim"] == 16  # the default stays what every existing caller trains
    cfg = drafter_config(
        info, mask_token_id=3, block_size=4, num_layers=2, target_layer_ids=[1], head_dim=32
    )
    assert (cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (32, 4, 2)


# ---- the engine's own time -------------------------------------------------------------


class ScriptedVllm:
    """A loopback HTTP server answering as vLLM does: each completion is `ANSWER`, and it
    adds that answer's verify steps to the spec-decode counters and `PER_REQUEST` seconds
    to the decode-time histogram of ``/metrics`` (which starts with earlier requests')."""

    PER_REQUEST = 0.25

    def __init__(self):
        import http.server
        import json
        import threading

        self.requests, self.seconds = 3, 1.0  # before this run
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, body: bytes, kind: str):
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._send(server.metrics().encode(), "text/plain")

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                server.requests += 1
                server.seconds += server.PER_REQUEST
                self._send(json.dumps(ANSWER).encode(), "application/json")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def metrics(self) -> str:
        n = self.requests - 3  # this run's: 2 steps each, 3 + 0 accepted of 3 + 3 drafted
        counts = {"53.0": 53 + 2 * n, "159.0": 159 + 6 * n, "66.0": 66 + 3 * n}
        text = METRICS
        for old, new in counts.items():
            text = text.replace(f"}} {old}\n", f"}} {new}.0\n", 1)
        for pos, old in (("0", 33), ("1", 17), ("2", 16)):
            text = text.replace(f'position="{pos}"}} {old}.0', f'position="{pos}"}} {old + n}.0')
        labels = 'engine="0",model_name="/m"'
        return text + (
            f'vllm:request_decode_time_seconds_bucket{{{labels},le="+Inf"}} {self.requests}.0\n'
            f"vllm:request_decode_time_seconds_count{{{labels}}} {self.requests}.0\n"
            f"vllm:request_decode_time_seconds_sum{{{labels}}} {self.seconds}\n"
        )

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_the_engines_decode_time_is_read_around_the_run_from_its_metrics():
    from remote.online import engine_time, vllm

    server = ScriptedVllm()
    try:
        prompt = ANSWER["choices"][0]["prompt_token_ids"]
        rows = [{"id": i, "prompt_ids": prompt, "completion_ids": [1] * 6} for i in "ab"]
        out = vllm.measure(server.url, rows, 320, model="/m")
    finally:
        server.close()
    assert out["counters_agree"] is True
    assert out["decode"] == {"seconds": 0.5, "requests": 2, "source": engine_time.DECODE_TIME}
    costs = verdict.engine_costs(out["decode"], rows, out["counters"])
    assert costs == {
        "source": "vllm:request_decode_time_seconds",
        "decode_s": 0.5,
        "decode_tokens": 10,  # each request's tokens after its first (the prefill's)
        "verify_steps": 4,
        "time_per_output_token_s": 0.05,
        "time_per_verify_step_s": 0.125,
        "tokens_per_verify_step": 2.5,
    }
    # A histogram that did not count every request is not these requests' time.
    assert verdict.engine_costs({**out["decode"], "requests": 1}, rows, out["counters"]) is None
    assert engine_time.decode_time(METRICS, "m") is None  # older vLLM: no histogram, no time


@pytest.mark.parametrize(
    "line, message",
    [
        ("vllm:request_decode_time_seconds_sum 1e999", "not seconds or a count >= 0"),
        ("vllm:request_decode_time_seconds_count 2.5", "not a whole count"),
    ],
)
def test_a_bad_decode_time_is_one_line(line, message):
    from remote.online import engine_time

    with pytest.raises(UserError) as err:
        engine_time.decode_time(METRICS + line + "\n", "http://h/metrics")
    assert str(err.value).startswith("http://h/metrics") and message in str(err.value)
