"""`dflash online` without a server: the inventory's ``roles.eval.serve`` (one line per
mistake, naming file and line), the command's one-line refusals before anything connects,
the verdict a host sends checked field by field (`remote.online.verdict_doc`), and SGLang's
per-request fields (`remote.online.sglang`, checked against its documented fields only)."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path

import pytest

from orchestrator.errors import DflashError
from orchestrator.eval.online.run import OnlineOptions, check_online_files
from orchestrator.inventory import InventoryError, parse_inventory
from remote.errors import UserError
from remote.online import verdict
from remote.online.sglang import parse_generate
from remote.online.spec import ServeSpec
from remote.online.verdict_doc import check_verdict
from remote.protocol import ResultError
from tests.helpers.cli import dflash, one_error_line
from tests.helpers.servers import Raw, ScriptedServer, redirect

HOST = """\
hosts:
  ev:
    hostname: 127.0.0.1
    port: 1
    roles:
      eval:
        drafters: /d
        target_model: /t
        ground_truth: /gt.jsonl
        ground_truth_kind: file
"""


def test_the_inventory_names_the_serving_engine():
    inv = parse_inventory(
        HOST + "        serve: {engine: vllm, python: /opt/vllm/bin/python, kv_cache_gib: 2}\n",
        Path("inv.yaml"),
    )
    serve = inv.hosts["ev"].eval.serve
    assert serve == ServeSpec(engine="vllm", python="/opt/vllm/bin/python", kv_cache_gib=2)
    assert parse_inventory(HOST, Path("inv.yaml")).hosts["ev"].eval.serve is None


@pytest.mark.parametrize(
    "serve, words",
    [
        ("{engine: vllm, python: venv/bin/python}", "serve.python 'venv/bin/python' must be"),
        ("{engine: tgi, python: /x}", "serve.engine 'tgi' is not one of vllm, sglang"),
        ("{engine: sglang, python: /x}", "serve.engine sglang cannot be started by dflash"),
        ("{engine: vllm}", "serve needs exactly one of python"),
        ("{python: /x, pyhton: /y}", "serve has unknown keys pyhton"),
        ("{python: /x, kv_cache_gib: 0}", "serve.kv_cache_gib must be a whole number of GiB"),
        ("{python: /x, kv_cache_gib: 1.5}", "serve.kv_cache_gib must be a whole number of GiB"),
        ("{url: 'ftp://x'}", "serve.url 'ftp://x' needs http://"),
        ("{python: [/x]}", "serve.python: expected a single value"),
        ("/opt/vllm/bin/python", "serve: expected a mapping"),
    ],
)
def test_a_bad_serve_entry_is_one_line_with_file_and_line(serve, words):
    with pytest.raises(InventoryError) as err:
        parse_inventory(HOST + f"        serve: {serve}\n", Path("inv.yaml"))
    message = str(err.value)
    assert message.startswith("inv.yaml:") and "hosts.ev.roles.eval" in message
    assert words in message and "\n" not in message


def test_no_serving_engine_says_how_to_set_it(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text(HOST)
    run = dflash("online", "--checkpoint", "step_1", "-i", str(inv))
    assert run.returncode != 0
    line = one_error_line(run)
    assert "roles.eval.serve: {engine: vllm, python:" in line and "--server URL" in line
    assert "scripts/setup-vllm.sh" in line


@pytest.mark.parametrize(
    "args, words",
    [
        (["--server", "localhost:8000"], "--server 'localhost:8000' needs http://"),
        (["--server", "http://u@h:1"], "may not carry a user"),
        (["--server", "http://h:1", "--engine", "tgi"], "--engine 'tgi' is not one of"),
        (["--concurrency", "1,x"], "--concurrency '1,x' is not a list of whole numbers"),
        (["--concurrency", "0,4"], "ascending whole numbers 1..256"),
        (["--baseline", "--baseline-server", "http://h:1"], "--baseline starts a server"),
        (["--baseline-server", "h:1"], "--baseline-server 'h:1' needs http://"),
        (["--server", "http://h:1", "--baseline"], "--baseline starts vLLM without the drafter"),
        (["--server", "http://h:1", "--temperature", "1", "--concurrency", "1,4"], "one level"),
        (["--server", "http://h:1", "--engine", "sglang", "--temperature", "1"], "vLLM only"),
        (["--server", "http://h:1", "--draft-policy", "sample"], "above temperature 0 only"),
        (
            ["--server", "http://h:1", "--temperature", "1", "--baseline-server", "http://h:2"],
            "--baseline checks the target alone",
        ),
    ],
)
def test_bad_server_options_are_one_line_before_connecting(tmp_path, args, words):
    inv = tmp_path / "inv.yaml"
    inv.write_text(HOST)  # port 1: nothing listens; these fail before any connection
    run = dflash("online", "--checkpoint", "step_1", "-i", str(inv), *args)
    assert run.returncode != 0
    assert words in one_error_line(run)


def test_a_server_url_overrides_the_inventory_and_keeps_its_engine():
    role = ServeSpec(engine="sglang", url="http://10.0.0.1:30000")
    got = OnlineOptions(server="http://127.0.0.1:8000").serve_spec(role)
    assert got == ServeSpec(engine="sglang", url="http://127.0.0.1:8000")
    with pytest.raises(DflashError, match="no serving engine"):
        OnlineOptions().serve_spec(None, "ev")
    started = ServeSpec(engine="vllm", python="/opt/v/bin/python")
    with pytest.raises(DflashError, match="--engine sglang says what --server URL is"):
        OnlineOptions(engine="sglang").serve_spec(started, "ev")


# ---- the verdict a host sends ----------------------------------------------------------------


def _verdict() -> dict:
    gt, off, on = [], [], []
    for i, r in enumerate([[4, 1, 2], [3, 4]]):
        completion = list(range(10, 11 + sum(r)))
        gt.append({"id": f"s{i}", "prompt_ids": [1, 2], "completion_ids": completion})
        off.append({"id": f"s{i}", "rounds": r})
        acc = [n - 1 for n in r]
        on.append(
            {
                "id": f"s{i}",
                "token_ids": completion,
                "per_step_accepted": acc,
                "per_step_drafted": [3] * len(acc),
                "num_spec_tokens": 3,
            }
        )
    v = verdict.compare(gt, off, on, block_size=4, offline_dtype="float32")
    v["server"] = {"engine": "vllm", "started_here": True, "url": "http://127.0.0.1:9"}
    decode = {"seconds": 0.36, "requests": 2, "source": "vllm:request_decode_time_seconds"}
    v["engine_costs"] = verdict.engine_costs(decode, gt, {"drafts": 5})
    v["levels"] = [
        {
            "concurrency": 1,
            "seconds": 0.5,
            "tokens": 16,
            "tokens_per_s": 32.0,
            "lossless": 2,
            "baseline_tokens_per_s": 16.0,
            "speedup": 2.0,
        },
    ]
    v["baseline"] = {
        "levels": [
            {"concurrency": 1, "seconds": 1.0, "tokens": 16, "tokens_per_s": 16.0, "lossless": 2}
        ]
    }
    v["deviations"] = [
        {"name": "vllm_cpu_shared_k_norm", "status": "confirmed", "tested": 2, "reproduced": 2}
    ]
    return v


def test_a_verdict_made_by_compare_passes_its_check():
    v = _verdict()
    assert check_verdict(copy.deepcopy(v)) == v
    files = {"verdict.json": json.dumps(v).encode()}
    check_online_files(files)


@pytest.mark.parametrize(
    "path, value, words",
    [
        (("verdict",), "great", "is not a known cause"),
        (("verdict",), "engine_disagrees", "leading the diagnosis"),
        (("samples",), 3, "per_sample is 2 but the verdict's samples say 3"),
        (("lossless", "samples"), 1, "lossless.samples is 1"),
        (("lossless", "ok"), False, "lossless.ok disagrees"),
        (("rounds_equal", "samples"), 0, "rounds_equal.samples is 0"),
        (("offline", "tau_token_weighted"), "2.3", "offline.tau_token_weighted"),
        (("per_sample", 0, "online_rounds"), [1, "x"], "per_sample[0].online_rounds[1]"),
        (("server", "url"), 9, "server.url"),
        (("schema",), "dflash.eval/1", "expected dflash.online-verdict/1"),
        (("diagnosis",), None, "diagnosis missing"),
        (("engine_costs", "decode_s"), -0.36, "engine_costs.decode_s is -0.36"),
        (("engine_costs", "time_per_output_token_s"), 9.0, "not decode_s / decode_tokens"),
        (("engine_costs", "time_per_verify_step_s"), 0.1, "not decode_s / verify_steps"),
        (("engine_costs", "verify_steps"), "5", "engine_costs.verify_steps"),
        (("levels", 0, "tokens_per_s"), 1.0, "levels[0].tokens_per_s is 1.0, not tokens"),
        (("levels", 0, "concurrency"), 0, "is not ascending levels >= 1"),
        (("levels", 0, "speedup"), 9.0, "levels[0].speedup is 9.0"),
        (("levels", 0, "lossless"), 3, "levels[0].lossless is 3, not 0..2"),
        (("baseline", "levels", 0, "concurrency"), 2, "baseline.levels are not the levels"),
        (("deviations", 0, "reproduced"), 1, "is confirmed but reproduces 1 of 2"),
        (("deviations", 0, "status"), "maybe", "deviations[0] is 'maybe'"),
        (("invalid",), [{"field": "f", "detail": "d"}], "gives no online tau, yet this one"),
        (("server", "threads"), "1", "server.threads"),
    ],
)
def test_every_bad_verdict_field_is_named(path, value, words):
    v = _verdict()
    at = v
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = value
    with pytest.raises(ResultError) as err:
        check_verdict(v)
    assert words in str(err.value)


def test_a_pull_without_a_good_verdict_is_refused():
    with pytest.raises(ResultError, match="verdict.json is missing"):
        check_online_files({})
    with pytest.raises(ResultError, match="not valid JSON"):
        check_online_files({"verdict.json": b"{"})


def test_decode_files_refuses_a_bad_verdict_before_writing(tmp_path):
    from orchestrator.errors import RemoteCommandError
    from orchestrator.eval.pull import decode_files

    class Host:
        name = "ev"

    v = _verdict()
    v["verdict"] = "great"
    files = {
        "result.json": base64.b64encode(b'{"schema": "dflash.eval/1"}').decode(),
        "verdict.json": base64.b64encode(json.dumps(v).encode()).decode(),
    }
    with pytest.raises(RemoteCommandError, match="not a known cause.*nothing was pulled"):
        decode_files(Host(), "j1", files, ("result.json", "verdict.json"), check_online_files)


# ---- SGLang ----------------------------------------------------------------------------------

WHERE = "http://127.0.0.1:30000/generate"


def _sglang(**meta) -> dict:
    return {
        "text": "",
        "output_ids": [5, 6, 7, 8, 9, 10],
        "meta_info": {
            "id": "x",
            "prompt_tokens": 3,
            "completion_tokens": 6,
            "spec_verify_ct": 3,
            "spec_accept_length": 2.0,
            "spec_accept_histogram": [1, 1, 1, 0],
            **meta,
        },
    }


def test_an_sglang_answer_gives_its_steps_and_mean():
    got = parse_generate(_sglang(), WHERE, 6, 320)
    assert got["num_spec_steps"] == 3 and got["mean_acceptance_length"] == 2.0
    assert got["acceptance_histogram"] == [1, 1, 1, 0] and got["token_ids"][0] == 5
    assert (
        parse_generate(_sglang(spec_accept_histogram=None), WHERE, 6, 320)["acceptance_histogram"]
        is None
    )


@pytest.mark.parametrize(
    "meta, words",
    [
        ({"spec_verify_ct": None}, "spec_verify_ct is None, not a count"),
        ({"spec_verify_ct": 7}, "spec_verify_ct is 7"),
        ({"spec_accept_length": "2"}, "spec_accept_length is '2'"),
        ({"spec_accept_length": 0.5}, "spec_accept_length is 0.5"),
        ({"spec_accept_histogram": [1, 1]}, "not counts adding up to its 3 verify steps"),
    ],
)
def test_bad_sglang_fields_are_one_line(meta, words):
    with pytest.raises(UserError) as err:
        parse_generate(_sglang(**meta), WHERE, 6, 320)
    assert words in str(err.value) and WHERE in str(err.value)


def test_sglang_output_ids_are_checked():
    answer = _sglang()
    answer["output_ids"] = [5, 6, 999, 8, 9, 10]
    with pytest.raises(UserError, match="outside the target's vocabulary"):
        parse_generate(answer, WHERE, 6, 320)
    with pytest.raises(UserError, match="not 5 token ids"):
        parse_generate(_sglang(), WHERE, 5, 320)


def test_without_per_step_arrays_the_verdict_compares_the_engines_own_mean():
    gt = [{"id": "a", "prompt_ids": [1], "completion_ids": list(range(10, 18))}]
    off = [{"id": "a", "rounds": [4, 3]}]
    on = [
        {
            "id": "a",
            "token_ids": list(range(10, 18)),
            "num_spec_tokens": None,
            "num_spec_steps": 3,
            "mean_acceptance_length": 2.5,
            "per_step_accepted": None,
        }
    ]
    v = verdict.compare(gt, off, on, block_size=4)
    assert v["verdict"] == "no_per_step_metrics" and v["online"] is None
    assert v["online_uncut_tau"] == 2.5 and v["lossless"]["ok"]
    assert "its own uncut mean: tau 2.500" in v["diagnosis"][0]["detail"]
    check_verdict(v)


# ---- the engine's answers go through the host side's one HTTP client --------------------


def test_an_engine_that_redirects_is_refused_not_followed():
    from remote.online.vllm import complete

    with ScriptedServer(lambda path, req: {"choices": []}) as elsewhere:
        with ScriptedServer(lambda path, req: redirect(elsewhere.url + path)) as engine:
            with pytest.raises(UserError) as err:
                complete(engine.url, [1, 2], 4, vocab=100, timeout=10)
    assert "serving engine" in str(err.value) and "redirect" in str(err.value)
    assert elsewhere.requests == []


def test_a_metrics_page_past_its_bound_is_refused_before_parsing():
    from remote.online.counters import METRICS_BYTES, read_counters

    page = b"# " + b"x" * (METRICS_BYTES + 16)
    with ScriptedServer(get_reply=lambda path: Raw(page, length=False)) as engine:
        with pytest.raises(UserError) as err:
            read_counters(engine.url, timeout=30)
    assert "serving engine" in str(err.value) and str(METRICS_BYTES) in str(err.value)


def test_an_online_runs_view_puts_the_engines_times_beside_the_hosts_estimate(tmp_path):
    from orchestrator.results import online_view, speedup
    from orchestrator.results import store as res
    from remote.protocol import metrics as registry
    from tests.helpers.runs import edit_result, make_run

    root = tmp_path / "results"
    run_dir = make_run(root, "run-on", "step-300", 300, skill=0.7, samples=4)
    costs = {
        "target_step_s": 0.010,
        "target_verify_s": {"4": 0.012},
        "drafter_round_s": 0.003,
    }
    edit_result(run_dir, lambda d: d["timings"].update(round_costs=costs))
    edit_result(run_dir, lambda d: d["inputs"].update(block_size=4))
    v = _verdict()
    (run_dir / "verdict.json").write_text(json.dumps(v))
    run = res.load_run(run_dir)
    sp = online_view.speed(v, run)
    assert sp["engine"]["decode_tokens"] == 14  # 7 after each sample's first token
    assert sp["engine"]["time_per_output_token_s"] == pytest.approx(0.36 / 14)
    assert sp["engine"]["time_per_verify_step_s"] == pytest.approx(0.36 / 5)
    est = speedup.estimate(run)["chain"]
    assert sp["offline"]["speedup_estimate"] == est
    tau = run.metrics["tau_token_weighted"]
    assert sp["offline"]["time_per_output_token_s"] == pytest.approx(0.015 / tau)
    # measured against the baseline (the target served alone): tokens/s with and without
    assert sp["engine_speedup_measured"] == 2.0 and sp["engine_speedup_note"] is None
    assert (sp["engine_tokens_per_s"], sp["engine_plain_tokens_per_s"]) == (32.0, 16.0)
    shown = dflash("results", "show", "run-on", "--results-dir", str(root), env={"COLUMNS": "70"})
    assert shown.returncode == 0, shown.stderr
    out = " ".join(shown.stdout.split())
    assert "the serving engine's own times beside the eval host's estimate" in out
    assert f"{1e3 * 0.36 / 14:.3f}" in out and f"{1e3 * 0.36 / 5:.3f}" in out
    assert f"{est:.2f}x" in out and "32.0 / 16.0" in out and "2.00x" in out
    # both taus for both sides: the per-sample one results show headlines, and the
    # token-weighted one (main showed only the latter, and never the engine's per-sample)
    for name in ("tau_per_sample_mean", "tau_token_weighted"):
        off, on = v["offline"][name], v["online"][name]
        label = registry.find(name).label
        assert online_view.tau_rows(v)[0 if name == "tau_per_sample_mean" else 1] == (
            label,
            f"{off:.3f}",
            f"{on:.3f}",
        )
        assert f"{off:.3f} / {on:.3f}" in out
    # without a baseline, why the engine's speedup is not measured
    del v["baseline"], v["levels"]
    sp = online_view.speed(v, run)
    assert sp["engine_speedup_measured"] is None and "--baseline" in sp["engine_speedup_note"]
