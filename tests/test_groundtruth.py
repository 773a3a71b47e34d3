"""Ground truth over real HTTP on loopback: SGLang /generate, OpenAI /v1/completions with
token ids, a text-only server (ours, and `transformers serve` when it can run), the cache,
and every failure as one clear line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from remote.errors import UserError
from remote.eval import groundtruth
from tests.helpers.cli import dflash, one_error_line
from tests.helpers.servers import (
    BatchedReply,
    Raw,
    ScriptedServer,
    as_json,
    ids_reply,
    redirect,
)
from tests.helpers.sshd import ssh_host_entry

MAX_NEW = 10


def make_spec(
    tmp_path: Path, target: Path, prompts: Path, kind: str, url: str | None = None, **extra
) -> dict:
    spec = {
        "eval": {"target": str(target), "dtype": "float32"},
        "workdir": str(tmp_path / "wd"),
        "prompts": {"path": str(prompts)},
        "samples": 3,
        "seed": 0,
        "sampling": {"temperature": 0, "max_new_tokens": MAX_NEW},
        "ground_truth": {"kind": kind, "url": url, "timeout": 20},
    }
    spec.update(extra)
    return spec


def read(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def uncached_greedy(target: Path, prompt_ids: list[int], n: int) -> list[int]:
    """An independent oracle: argmax of a full forward per step, no KV cache."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    ids = list(prompt_ids)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids) :]


def test_prompts_both_forms_chat_template_and_seeded_choice(tiny_target, prompts_file):
    every = groundtruth.load_prompts(str(prompts_file))
    assert [p["text"] for p in every][:3] == [
        "What is two plus two?",
        "Write a haiku about rain.",
        "Name three colours.",
    ]
    assert every[2]["id"] == "custom"
    picked = groundtruth.load_prompts(str(prompts_file), samples=3, seed=7)
    assert picked == groundtruth.load_prompts(str(prompts_file), samples=3, seed=7)
    assert len(picked) == 3 and all(p in every for p in picked)
    assert [every.index(p) for p in picked] == sorted(every.index(p) for p in picked)
    tok = groundtruth.load_tokenizer(str(tiny_target))
    text, ids = groundtruth.render_prompt(tok, "hello there", thinking=False)
    assert text.startswith("<|im_start|>user\nhello there") and text.endswith("assistant\n")
    assert ids == tok(text, add_special_tokens=False)["input_ids"]


def test_bad_prompt_line_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"question": "no"}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:2: expected"):
        groundtruth.load_prompts(str(bad))


def test_sglang_generate_gives_greedy_ids_and_is_cached(
    tmp_path, tiny_target, prompts_file, server
):
    spec = make_spec(tmp_path, tiny_target, prompts_file, "sglang", server.url)
    path, info = groundtruth.prepare(spec)
    records = read(path)
    assert len(records) == 3 and info["cached"] is False and info["kind"] == "sglang"
    for r in records:
        assert len(r["completion_ids"]) == MAX_NEW
        assert r["completion_ids"] == uncached_greedy(tiny_target, r["prompt_ids"], MAX_NEW)
    sent = [body for p, body in server.requests if p == "/generate"]
    assert len(sent) == 3
    assert all(
        b["sampling_params"] == {"temperature": 0.0, "max_new_tokens": MAX_NEW} for b in sent
    )
    # Sent together, they arrive in any order; each prompt exactly once.
    assert sorted(b["input_ids"] for b in sent) == sorted(r["prompt_ids"] for r in records)

    # A second checkpoint evaluated on the same prompts: no request at all.
    path2, info2 = groundtruth.prepare(spec)
    assert info2["cached"] is True and path2 == path and len(server.requests) == 3
    # Other sampling parameters are another ground truth.
    spec["sampling"]["max_new_tokens"] = MAX_NEW + 2
    _, info3 = groundtruth.prepare(spec)
    assert info3["cached"] is False and info3["cache_key"] != info["cache_key"]


def _cache_files(spec: dict) -> list[Path]:
    return sorted((Path(spec["workdir"]) / "groundtruth").glob("*.json*"))


def test_a_bad_servers_ids_are_never_cached_nor_given_to_a_later_server(
    tmp_path, tiny_target, prompts_file, server
):
    """Ids outside the target's vocabulary are refused in one line naming the server and
    the id, before anything is cached; the real server asked next generates its own (and
    the result names it), instead of being handed the bad server's ids."""
    spec = make_spec(tmp_path, tiny_target, prompts_file, "sglang")
    with ScriptedServer(ids_reply([5, 100_000])) as bad:
        spec["ground_truth"]["url"] = bad.url
        with pytest.raises(UserError) as err:
            groundtruth.prepare(spec)
    line = str(err.value)
    assert "\n" not in line and f"{bad.url}/generate" in line
    assert "token id 100000, outside the target's vocabulary (0..319)" in line
    assert _cache_files(spec) == []
    spec["ground_truth"]["url"] = server.url
    path, info = groundtruth.prepare(spec)
    assert info["cached"] is False and len(server.requests) == 3
    for r in read(path):
        assert r["completion_ids"] == server.greedy(r["prompt_ids"], MAX_NEW)
    assert info["source"]["url"] == f"{server.url}/generate"
    assert info["source"]["model"] == server.model_path  # as /get_model_info reports it


@pytest.mark.parametrize("kind", ["sglang", "openai", "openai-text"])
def test_concurrent_requests_give_the_serial_ground_truth(
    tmp_path, tiny_target, prompts_file, server, kind
):
    """Requests in flight together (the default) give the records, in prompt order, and the
    cache entry that one request at a time gives, from the real greedy server."""
    runs = {}
    for concurrency in (1, 4):
        spec = make_spec(
            tmp_path / f"c{concurrency}", tiny_target, prompts_file, kind, server.url, samples=None
        )
        spec["ground_truth"]["concurrency"] = concurrency
        path, info = groundtruth.prepare(spec)
        runs[concurrency] = (read(path), info)
    (serial, s_info), (together, t_info) = runs[1], runs[4]
    assert len(serial) == 5 and together == serial
    assert t_info["cache_key"] == s_info["cache_key"]
    assert t_info.get("retokenisation") == s_info.get("retokenisation")
    if kind != "openai-text":  # retokenised text need not give the generated ids back
        for r in together:
            assert r["completion_ids"] == server.greedy(r["prompt_ids"], MAX_NEW)


def _echo_reply(path: str, body: dict) -> dict:
    """Answers that name their prompt (its length and last id), so a mix-up shows."""
    prompt = body.get("input_ids") or body.get("prompt")
    return ids_reply([len(prompt) % 300, prompt[-1]])(path, body)


def test_a_batching_server_gets_requests_together_and_answers_stay_in_order(
    tmp_path, tiny_target, prompts_file
):
    """Against a server that answers concurrent requests as one batch (later prompts may
    answer first), each record keeps its own prompt's answer, in prompt order; no more
    requests are in flight than the concurrency allows."""
    reply = BatchedReply(_echo_reply, latency=0.05)
    with ScriptedServer(reply) as batching:
        spec = make_spec(tmp_path, tiny_target, prompts_file, "sglang", batching.url, samples=None)
        spec["ground_truth"]["concurrency"] = 3
        path, info = groundtruth.prepare(spec)
    records = read(path)
    assert [r["id"] for r in records] == [
        p["id"] for p in groundtruth.load_prompts(str(prompts_file))
    ]
    for r in records:
        assert r["completion_ids"] == [len(r["prompt_ids"]) % 300, r["prompt_ids"][-1]]
    assert reply.peak == 3 and max(reply.batches) >= 2 and sum(reply.batches) == 5


def test_a_bad_answer_among_concurrent_ones_fails_in_prompt_order_and_caches_nothing(
    tmp_path, tiny_target, prompts_file
):
    """The first bad answer in prompt order is the one reported, whichever arrives first
    while requests are in flight together, and nothing is cached."""
    prompts = groundtruth.load_prompts(str(prompts_file))
    tok = groundtruth.load_tokenizer(str(tiny_target))
    ids = [groundtruth.render_prompt(tok, p["text"], False)[1] for p in prompts]
    bad = {json.dumps(ids[3]): 100_003, json.dumps(ids[1]): 100_001}

    def reply(path: str, body: dict) -> dict:
        wrong = bad.get(json.dumps(body["input_ids"]))
        if wrong == 100_001:
            time.sleep(0.2)  # the later prompt's bad answer arrives first
        return ids_reply([5] if wrong is None else [5, wrong])(path, body)

    with ScriptedServer(reply) as bad_server:
        spec = make_spec(
            tmp_path, tiny_target, prompts_file, "sglang", bad_server.url, samples=None
        )
        with pytest.raises(UserError) as err:
            groundtruth.prepare(spec)
    line = str(err.value)
    assert f"for prompt {prompts[1]['id']} holds token id 100001" in line
    assert "\n" not in line and _cache_files(spec) == []


def test_a_bad_concurrency_is_one_line(tmp_path, tiny_target, prompts_file, server):
    spec = make_spec(tmp_path, tiny_target, prompts_file, "sglang", server.url)
    spec["ground_truth"]["concurrency"] = 0
    with pytest.raises(
        UserError,
        match=r"^job spec: the ground-truth concurrency must be a whole "
        r"number of at least 1, got 0$",
    ):
        groundtruth.prepare(spec)


@pytest.mark.parametrize("kind", ["sglang", "openai"])
def test_cache_key_names_the_server_and_the_model_it_serves(
    tmp_path, tiny_target, prompts_file, server, kind
):
    """Same target, prompts and sampling: another URL, or another model behind the same URL,
    is another ground truth. A cache hit says so, and names the source that made it."""
    spec = make_spec(tmp_path, tiny_target, prompts_file, kind)
    with ScriptedServer(ids_reply([5, 6, 7]), model_path="/models/a") as scripted:
        spec["ground_truth"]["url"] = scripted.url
        path, first = groundtruth.prepare(spec)
        src = first["source"]
        assert first["cached"] is False and src["kind"] == kind
        assert src["url"].startswith(scripted.url) and isinstance(src["made"], float)
        if kind == "sglang":
            assert src["model"] == "/models/a"
        else:
            assert src["model"] == "served" and src["model_root"] == "/models/a"
        assert all(r["completion_ids"] == [5, 6, 7] for r in read(path))
        asked = len(scripted.requests)
        again_path, again = groundtruth.prepare(spec)
        assert again["cached"] is True and again_path == path
        assert again["source"] == src and len(scripted.requests) == asked
        # The operator restarts the server on the same port with other weights.
        scripted.model_path = "/models/b"
        other_path, other = groundtruth.prepare(spec)
        assert other["cached"] is False and other_path != path
        assert (other["source"].get("model_root") or other["source"]["model"]) == "/models/b"
    # Another server (the real one) for the same prompts: its own greedy ids, not [5, 6, 7].
    spec["ground_truth"]["url"] = server.url + ("/v1" if kind == "openai" else "")
    real_path, real = groundtruth.prepare(spec)
    assert real["cached"] is False and real["source"]["url"].startswith(server.url)
    for r in read(real_path):
        assert r["completion_ids"] == server.greedy(r["prompt_ids"], MAX_NEW)
    assert len(_cache_files(spec)) == 6  # three entries, data and meta each


def test_a_damaged_cache_entry_is_ignored_and_remade(tmp_path, tiny_target, prompts_file, server):
    spec = make_spec(tmp_path, tiny_target, prompts_file, "sglang", server.url)
    path, _ = groundtruth.prepare(spec)
    good = Path(path).read_text()
    Path(path).write_text(good.replace('"completion_ids": [', '"completion_ids": [999999, ', 1))
    _, info = groundtruth.prepare(spec)
    assert info["cached"] is False and Path(path).read_text() == good


@pytest.mark.parametrize(
    "kind,answer",
    [
        ("sglang", {"output_ids": [5, 6], "meta_info": {"sampling_params": {"temperature": 0.8}}}),
        ("openai", {"choices": [{"token_ids": [5, 6], "temperature": 0.8}]}),
    ],
    ids=["sglang-meta-info", "openai-choice"],
)
def test_a_server_reporting_sampling_is_refused(tmp_path, tiny_target, prompts_file, kind, answer):
    """Temperature 0 was asked, the server says it sampled: refused (tau is measured
    against completions decoded as asked), in one line naming the server; nothing cached."""
    spec = make_spec(tmp_path, tiny_target, prompts_file, kind)
    with ScriptedServer(lambda path, body: answer) as sampled:
        spec["ground_truth"]["url"] = sampled.url
        with pytest.raises(UserError) as err:
            groundtruth.prepare(spec)
    line = str(err.value)
    assert "\n" not in line and sampled.url in line
    assert "reports other sampling than asked: temperature=0.8 (asked 0.0)" in line
    assert _cache_files(spec) == []


def test_openai_completions_with_token_ids(tmp_path, tiny_target, prompts_file, server):
    ids_path, _ = groundtruth.prepare(
        make_spec(tmp_path / "a", tiny_target, prompts_file, "sglang", server.url)
    )
    path, info = groundtruth.prepare(
        make_spec(tmp_path / "b", tiny_target, prompts_file, "openai", server.url + "/v1")
    )
    assert read(path) == read(ids_path)
    assert info["model"] == server.model_name  # found through /v1/models
    body = [b for p, b in server.requests if p == "/v1/completions"][0]
    assert body["return_token_ids"] is True and body["temperature"] == 0.0
    assert all(isinstance(x, int) for x in body["prompt"])


def test_openai_server_without_token_ids_is_refused_clearly(
    tmp_path, tiny_target, prompts_file, server
):
    server.mode = "text_only"
    spec = make_spec(tmp_path, tiny_target, prompts_file, "openai", server.url)
    with pytest.raises(UserError, match=r"returned no token ids.*openai-text") as err:
        groundtruth.prepare(spec)
    assert "\n" not in str(err.value)


def test_text_only_server_warns_and_records_retokenisation(
    tmp_path, tiny_target, prompts_file, server
):
    events = []
    spec = make_spec(tmp_path, tiny_target, prompts_file, "openai-text", server.url, samples=5)
    path, info = groundtruth.prepare(spec, emit=lambda ev, **kw: events.append((ev, kw)))
    records = read(path)
    assert any(ev == "warning" and "TEXT-only" in kw["message"] for ev, kw in events)
    retok = info["retokenisation"]
    assert retok["samples"] == 5
    tok = groundtruth.load_tokenizer(str(tiny_target))
    # Requests go out together, so the server's log is in arrival order: match by text.
    texts = [
        groundtruth.render_prompt(tok, p["text"], False)[0]
        for p in groundtruth.load_prompts(str(prompts_file), samples=5)
    ]
    assert sorted(texts) == sorted(
        b["prompt"] for p, b in server.requests if p == "/v1/completions"
    )
    expected = 0
    for r, text in zip(records, texts, strict=False):
        true_ids = server.greedy(r["prompt_ids"], MAX_NEW)
        ctext = tok.decode(true_ids, skip_special_tokens=True)
        assert r["completion_ids"] == tok(ctext, add_special_tokens=False)["input_ids"]
        expected += not groundtruth.retokenisation_check(
            tok, text, r["prompt_ids"], ctext, r["completion_ids"], len(true_ids)
        )
    assert retok["mismatched"] == expected
    assert retok["mismatch_rate"] == pytest.approx(expected / 5)
    # The cached copy still carries the warning and the rate.
    _, again = groundtruth.prepare(spec)
    assert again["cached"] and again["retokenisation"] == retok and again["warnings"]


def test_retokenisation_check_catches_lossy_text(tiny_target):
    tok = groundtruth.load_tokenizer(str(tiny_target))
    prompt_text, prompt_ids = groundtruth.render_prompt(tok, "hi", thinking=False)
    # One byte of a multi-byte character: a text server returns U+FFFD for it, which
    # retokenises to other ids than the model produced.
    lossy_ids = tok("é", add_special_tokens=False)["input_ids"][:1]
    lossy_text = tok.decode(lossy_ids)
    retok = tok(lossy_text, add_special_tokens=False)["input_ids"]
    assert retok != lossy_ids
    assert groundtruth.retokenisation_check(
        tok, prompt_text, prompt_ids, "hello", tok("hello", add_special_tokens=False)["input_ids"]
    )
    assert "\ufffd" in lossy_text
    assert not groundtruth.retokenisation_check(tok, prompt_text, prompt_ids, lossy_text, retok)
    # A server that counted other tokens than the retokenised ones: a mismatch.
    hello = tok("hello", add_special_tokens=False)["input_ids"]
    assert not groundtruth.retokenisation_check(
        tok, prompt_text, prompt_ids, "hello", hello, server_count=len(hello) + 1
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "mode,pattern",
    [
        ("500", r"answered HTTP 500 Internal Server Error: \{\"error\": \"CUDA out of memory\"\}"),
        ("malformed", r"returned malformed JSON: '<html>upstream proxy error</html>'"),
        ("slow", r"did not answer within 1s \(timed out\)"),
    ],
)
def test_server_failures_are_one_line(tmp_path, tiny_target, prompts_file, server, mode, pattern):
    server.mode = mode
    server.delay = 3.0
    spec = make_spec(tmp_path, tiny_target, prompts_file, "sglang", server.url)
    spec["ground_truth"]["timeout"] = 1
    with pytest.raises(UserError, match=pattern) as err:
        groundtruth.prepare(spec)
    assert "\n" not in str(err.value)
    assert not list((tmp_path / "wd" / "groundtruth").glob("*.json*"))  # nothing half-written


def test_a_client_that_gave_up_leaves_the_server_quiet(capfd):
    """Before: the late answer met a closed socket and socketserver printed a traceback,
    into whichever test (or the demo's terminal) was running by then."""
    answered = threading.Event()

    def late(path: str, body: dict) -> dict:
        time.sleep(0.5)
        answered.set()
        return ids_reply([5, 6, 7])(path, body)

    with ScriptedServer(late) as slow:
        with pytest.raises(UserError, match="timeout"):
            groundtruth.http_json(slow.url + "/generate", {"input_ids": [1]}, 0.1)
        assert answered.wait(10)
        time.sleep(0.5)  # the handler writes its answer to the closed connection
    assert "Traceback" not in capfd.readouterr().err


def test_server_down_is_one_line(tmp_path, tiny_target, prompts_file):
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(UserError, match=r"refused the connection.*is it running") as err:
        groundtruth.prepare(make_spec(tmp_path, tiny_target, prompts_file, "sglang", url))
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="refused the connection"):
        groundtruth.http_json(url + "/generate", {"input_ids": [1]}, 5)


def test_sampled_ground_truth_asks_each_completion_with_its_seed(
    tmp_path, tiny_target, prompts_file
):
    """At temperature 0.7 with --gt-samples 2 a server is asked each completion with the
    job's temperature and top-p and its own seed (`request_seed`), every completion its
    own record (``<prompt>#<index>``); an answer reporting another temperature is refused
    in one line; the cache key carries the settings (another seed: another entry)."""
    from remote.protocol import request_seed

    sent = []

    def answer(path, body):
        sent.append(body["sampling_params"])
        return {"output_ids": [5, 6], "meta_info": {"sampling_params": {"temperature": 0.7}}}

    spec = make_spec(tmp_path, tiny_target, prompts_file, "sglang")
    spec["sampling"].update(temperature=0.7, top_p=0.9, seed=3, completions=2)
    with ScriptedServer(answer) as srv:
        spec["ground_truth"]["url"] = srv.url
        path, info = groundtruth.prepare(spec)
        rows = read(path)
        assert len(rows) == 6 and [r["index"] for r in rows] == [0, 1] * 3
        assert all(r["id"] == f"{r['prompt_id']}#{r['index']}" for r in rows)
        seeds = [b["sampling_seed"] for b in sent]
        # concurrent requests: compared as sets
        assert sorted(seeds) == sorted(request_seed(3, r["prompt_id"], r["index"]) for r in rows)
        assert len(set(seeds)) == 6
        assert all(b["temperature"] == 0.7 and b["top_p"] == 0.9 for b in sent)
        assert "top_k" not in sent[0]  # off: not sent
        assert info["sampling"]["seed"] == 3 and info["sampling"]["completions"] == 2
        spec["sampling"]["seed"] = 4
        _, again = groundtruth.prepare(spec)
        assert again["cached"] is False and len(sent) == 12

    def hotter(path, body):
        return {"output_ids": [5], "meta_info": {"sampling_params": {"temperature": 1.0}}}

    spec["sampling"]["seed"] = 5
    with ScriptedServer(hotter) as srv:
        spec["ground_truth"]["url"] = srv.url
        with pytest.raises(UserError) as err:
            groundtruth.prepare(spec)
    assert "\n" not in str(err.value)
    assert "temperature=1.0 (asked 0.7)" in str(err.value)


def test_local_sampled_ground_truth_is_seeded_per_completion(tmp_path, tiny_target, prompts_file):
    """Local sampling: a completion depends on its own seed only (batched or alone, the
    same ids), two completions of one prompt differ, and temperature 0 with top-p is
    refused in one line (it applies to sampling only)."""

    def spec_at(where: str, concurrency: int) -> dict:
        spec = make_spec(tmp_path / where, tiny_target, prompts_file, "local")
        spec["sampling"].update(temperature=1.0, seed=1, completions=2)
        spec["ground_truth"]["concurrency"] = concurrency
        return spec

    batched, _ = groundtruth.prepare(spec_at("b", 6))
    alone, _ = groundtruth.prepare(spec_at("a", 1))
    assert read(batched) == read(alone)
    rows = read(batched)
    assert any(
        a["completion_ids"] != b["completion_ids"]
        for a, b in zip(rows[::2], rows[1::2], strict=True)
    )
    greedy, _ = groundtruth.prepare(make_spec(tmp_path / "g", tiny_target, prompts_file, "local"))
    assert [r["completion_ids"] for r in read(greedy)] != [r["completion_ids"] for r in rows[::2]]
    spec = make_spec(tmp_path / "t", tiny_target, prompts_file, "local")
    spec["sampling"]["top_p"] = 0.9
    with pytest.raises(Exception, match="--top-p apply to sampled ground truth only"):
        groundtruth.prepare(spec)


def test_local_generation_with_the_engines_loaded_target_gives_the_same_ids(
    tmp_path, tiny_target, prompts_file
):
    """A job loads its target once (`remote.eval.target`) and its local ground truth
    generates with that model, prompts of different lengths batched into one `generate`:
    the ids equal those of a model loaded for generation alone, one prompt at a time, and
    the loader is called once."""
    import torch

    from remote.eval import target as target_mod

    calls = []

    def load_model():
        calls.append(1)
        return target_mod.load_target(str(tiny_target), torch.float32).model

    spec = make_spec(tmp_path / "own", tiny_target, prompts_file, "local")
    spec["ground_truth"]["concurrency"] = 1  # one prompt per generate; the rest batch 3
    own, _ = groundtruth.prepare(spec)
    shared, info = groundtruth.prepare(
        make_spec(tmp_path / "shared", tiny_target, prompts_file, "local"), load_model=load_model
    )
    assert calls == [1] and info["cached"] is False
    assert read(shared) == read(own) and all(r["completion_ids"] for r in read(own))
    assert len({len(r["prompt_ids"]) for r in read(own)}) > 1  # the batch needed padding
    again, info = groundtruth.prepare(
        make_spec(tmp_path / "shared", tiny_target, prompts_file, "local"), load_model=load_model
    )
    assert info["cached"] is True and calls == [1]  # a cache hit loads nothing


def test_local_generation_and_file_source(tmp_path, tiny_target, prompts_file, server):
    path, info = groundtruth.prepare(make_spec(tmp_path / "l", tiny_target, prompts_file, "local"))
    local = read(path)
    assert info["source"]["kind"] == "local" and info["source"]["url"] is None
    assert info["source"]["model"] == str(tiny_target.resolve())
    served, _ = groundtruth.prepare(
        make_spec(tmp_path / "s", tiny_target, prompts_file, "sglang", server.url)
    )
    assert local == read(served)  # float32, same target: the same greedy ids
    spec = make_spec(tmp_path / "f", tiny_target, prompts_file, "file", samples=2, job_id="j")
    spec["ground_truth"]["path"] = path
    fpath, finfo = groundtruth.prepare(spec)
    assert len(read(fpath)) == 2 and all(r in local for r in read(fpath))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "prompt_ids": "text"}\n')
    spec["ground_truth"]["path"] = str(bad)
    with pytest.raises(UserError, match=r"bad.jsonl:1: expected"):
        groundtruth.prepare(spec)


@pytest.fixture(scope="module")
def transformers_serve(tiny_target, tmp_path_factory):
    """`transformers serve` pinned to the tiny target, offline, on a loopback port. Its
    packages (fastapi, uvicorn, openai, accelerate) are in the dev extra, so it runs; a
    server that cannot start skips with its log's path and last line."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    log = open(log_path, "wb")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
    exe = Path(sys.executable).parent / "transformers"
    proc = subprocess.Popen(
        [str(exe), "serve", str(tiny_target), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def skip(why: str):
        lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
        pytest.skip(
            f"transformers serve {why}; log {log_path}: {lines[-1].strip() if lines else '(empty)'}"
        )

    try:
        for _ in range(600):
            if proc.poll() is not None:
                skip(f"exited at start with {proc.returncode}")
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        else:
            skip("did not answer /health within 60 s")
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=20)
        log.close()


def test_transformers_serve_text_only_path(tmp_path, tiny_target, prompts_file, transformers_serve):
    events = []
    spec = make_spec(
        tmp_path, tiny_target, prompts_file, "openai-text", transformers_serve, samples=4
    )
    path, info = groundtruth.prepare(spec, emit=lambda ev, **kw: events.append((ev, kw)))
    records = read(path)
    assert len(records) == 4 and all(r["completion_ids"] for r in records)
    assert info["retokenisation"]["samples"] == 4
    assert 0.0 <= info["retokenisation"]["mismatch_rate"] <= 1.0
    assert any(ev == "warning" for ev, _ in events)
    # The tiny model's byte-level output decodes lossily: the check must notice some of it.
    truth = [uncached_greedy(tiny_target, r["prompt_ids"], MAX_NEW) for r in records]
    differ = sum(r["completion_ids"] != t for r, t in zip(records, truth, strict=False))
    # Every flagged sample really differs, and the check misses none of the lossy ones
    # this tiny byte-level model produces (all its differences here are lossy decodes).
    assert info["retokenisation"]["mismatched"] == differ
    assert info["retokenisation"]["mismatch_rate"] == pytest.approx(differ / 4)


# ---- servers that lie about HTTP itself: redirects, trickles, huge answers -------------------

# Generous: a phase that has not ended by then is hung (the bounds under test are ~1 s).
HANG_BOUND = 120.0


def bounded(work, limit: float = HANG_BOUND):
    """`work()`'s value or exception, from a thread; an AssertionError if it is still
    running after `limit` seconds (a hang: the thread is left behind, a daemon)."""
    box: dict = {}

    def run():
        try:
            box["value"] = work()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        raise AssertionError(f"still waiting after {limit:g}s: hung")
    if "error" in box:
        raise box["error"]
    return box["value"]


def refused(spec: dict) -> str:
    """The one line `prepare(spec)` is refused with, within the hang bound."""
    with pytest.raises(UserError) as err:
        bounded(lambda: groundtruth.prepare(spec))
    line = str(err.value)
    assert "\n" not in line
    return line


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("asked", ["/generate", "/get_model_info"])
def test_a_redirect_is_refused_naming_the_server_and_where_it_points(
    tmp_path, tiny_target, prompts_file, status, asked
):
    """A server that redirects a request (the ids POST, or the question which model it
    serves) is refused in one line naming it and the Location: the eval host never asks the
    other server anything (urllib would turn a 302 POST into a GET there), nothing is cached
    under the first server's name."""
    with ScriptedServer(get_reply=lambda path: {"output_ids": [5, 6, 7]}) as other:
        elsewhere = f"{other.url}/generate"
        with ScriptedServer(
            lambda path, body: redirect(elsewhere, status) if asked == "/generate" else None,
            get_reply=lambda path: redirect(elsewhere, status) if path == asked else None,
        ) as liar:
            spec = make_spec(tmp_path, tiny_target, prompts_file, "sglang", liar.url)
            line = refused(spec)
        assert f"ground truth server {liar.url}{asked} redirected" in line
        assert f"HTTP {status}" in line and elsewhere in line
        assert other.gets == [] and other.requests == []
    assert _cache_files(spec) == []


def _trickled_ids(path: str, body: dict) -> Raw:
    """A valid answer, one byte every 0.1 s from its status line on: about 30 s in all."""
    return as_json({"output_ids": [5, 6, 7], "meta_info": {"pad": "." * 150}}, chunk=1, pause=0.1)


def test_a_trickling_server_is_cut_at_the_request_deadline(tmp_path, tiny_target, prompts_file):
    """Bytes keep coming, so the per-read timeout never fires: the request's own deadline
    ends it, in one line naming the server and the setting to raise."""
    with ScriptedServer(_trickled_ids) as trickle:
        spec = make_spec(tmp_path, tiny_target, prompts_file, "sglang", trickle.url)
        spec["ground_truth"].update(timeout=20, deadline=1)
        line = refused(spec)
    assert f"ground truth server {trickle.url}/generate" in line
    assert "deadline of 1s" in line and "--gt-deadline" in line
    assert _cache_files(spec) == []


def test_the_phase_deadline_bounds_the_whole_ground_truth(tmp_path, tiny_target, prompts_file):
    """Every answer well inside its request deadline, the phase as a whole past its own:
    ended in one line naming the server and the phase setting."""

    def slow(path: str, body: dict) -> dict:
        time.sleep(0.4)
        return ids_reply([5, 6, 7])(path, body)

    with ScriptedServer(slow) as server:
        spec = make_spec(tmp_path, tiny_target, prompts_file, "sglang", server.url, samples=None)
        spec["ground_truth"].update(concurrency=1, deadline=20, phase_deadline=1)
        line = refused(spec)
    assert f"ground truth server {server.url}/generate" in line
    assert "phase" in line and "deadline of 1s" in line and "--gt-phase-deadline" in line
    assert len(server.requests) < 5 and _cache_files(spec) == []


def test_local_generation_keeps_the_phase_deadline(tmp_path, tiny_target, prompts_file):
    spec = make_spec(tmp_path, tiny_target, prompts_file, "local", samples=None)
    spec["sampling"]["max_new_tokens"] = 200
    spec["ground_truth"].update(concurrency=1, phase_deadline=0.001)
    line = refused(spec)
    assert f"local generation with {tiny_target}" in line and "--gt-phase-deadline" in line
    assert _cache_files(spec) == []


@pytest.mark.parametrize("key", ["timeout", "deadline", "phase_deadline"])
@pytest.mark.parametrize("value", [0, -1, "soon", float("inf")])
def test_a_bad_bound_is_one_line(tmp_path, tiny_target, prompts_file, server, key, value):
    spec = make_spec(tmp_path, tiny_target, prompts_file, "sglang", server.url)
    spec["ground_truth"][key] = value
    line = refused(spec)
    assert line.startswith("job spec: the ground-truth " + key.replace("_", " "))
    assert server.requests == []


PAD = 64 << 20  # far more than any completion of MAX_NEW ids can take


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "until-close"])
def test_an_answer_bigger_than_any_valid_one_is_refused_before_it_is_read_whole(
    tmp_path, tiny_target, prompts_file, length
):
    """A valid answer padded to 64 MiB: refused once it passes what MAX_NEW ids can take
    (announced by its Content-Length, or counted as it comes), naming the server and the
    bound; the server never got to send most of it."""
    body = json.dumps({"output_ids": [5, 6, 7]}).encode() + b" " * PAD
    with ScriptedServer(lambda path, req: Raw(body, length=length)) as huge:
        spec = make_spec(tmp_path, tiny_target, prompts_file, "sglang", huge.url)
        line = refused(spec)
        sent = huge.wait_sent(1)  # its handler notices the hang-up after the refusal
    assert f"ground truth server {huge.url}/generate" in line
    assert "bytes" in line and "larger than any answer" in line
    assert sent and max(sent) < PAD // 4
    assert _cache_files(spec) == []


def test_a_scripted_server_says_what_it_sent_once_its_handler_is_done():
    """`ScriptedServer.wait_sent` returns once the handler has stopped writing: a client
    that hangs up after a few bytes of a trickled answer finds them counted, however late
    the handler notices."""
    import socket

    body = b"x" * 4096
    with ScriptedServer(lambda path, req: Raw(body, chunk=256, pause=0.05)) as slow:
        with socket.create_connection(("127.0.0.1", slow.port)) as sock:
            sock.sendall(b"POST /generate HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
            assert sock.recv(16)
        sent = slow.wait_sent(1)
    assert len(sent) == 1 and 0 < sent[0] < len(Raw(body).wire())


def test_a_deeply_nested_answer_is_malformed_json_not_a_traceback(
    tmp_path, tiny_target, prompts_file
):
    with ScriptedServer(lambda path, req: Raw(b"[" * 200_000)) as nested:
        spec = make_spec(tmp_path, tiny_target, prompts_file, "sglang", nested.url)
        line = refused(spec)
    assert f"ground truth server {nested.url}/generate returned malformed JSON" in line


def test_fresh_ground_truth_remakes_the_cached_entry(tmp_path, tiny_target, prompts_file, server):
    spec = make_spec(tmp_path, tiny_target, prompts_file, "sglang", server.url)
    path, first = groundtruth.prepare(spec)
    _, again = groundtruth.prepare(spec)
    assert again["cached"] is True and len(server.requests) == 3
    spec["ground_truth"]["fresh"] = True
    fresh_path, fresh = groundtruth.prepare(spec)
    assert fresh["cached"] is False and fresh_path == path and len(server.requests) == 6
    assert fresh["source"]["made"] > first["source"]["made"]


def test_a_wholesale_disagreement_is_flagged_and_its_entry_leaves_the_cache(
    tmp_path, tiny_target, prompts_file
):
    """`judge`: a target agreement far below what any real server gives flags the ground
    truth (a warning, ``suspect``) and takes its entry out of the cache, into the job's
    folder (kept for a look, reused by nothing); a healthy agreement changes nothing."""
    from remote.protocol import GT_SUSPECT_AGREEMENT

    with ScriptedServer(ids_reply([5, 6, 7])) as wrong:
        spec = make_spec(tmp_path, tiny_target, prompts_file, "sglang", wrong.url)
        path, info = groundtruth.prepare(spec)
    job = tmp_path / "job"
    job.mkdir()
    events = []
    good = groundtruth.judge(dict(info), {"rate": 0.97}, job)
    assert "suspect" not in good and Path(path).is_file()
    judged = groundtruth.judge(
        info, {"match": 0, "total": 9, "rate": 0.0}, job, emit=lambda e, **k: events.append(k)
    )
    assert judged["suspect"]["agreement"] == 0.0
    assert judged["suspect"]["threshold"] == GT_SUSPECT_AGREEMENT
    assert judged["suspect"]["evicted"] is True and _cache_files(spec) == []
    assert Path(judged["file"]).parent == job and Path(judged["file"]).is_file()
    (warning,) = judged["warnings"]
    assert "target agreement 0%" in warning and wrong.url in warning
    assert events == [{"message": warning}]


# ---- end to end: `dflash remote-eval` over a real loopback sshd ------------------------------


@pytest.fixture(scope="module")
def drafters(eval_sshd, tiny_target) -> Path:
    """One checkpoint of a tiny drafter trained for real, in the eval host's folders."""
    from orchestrator.demo.train import train_drafter

    folder = eval_sshd.root / "gt-drafters"
    if not (folder / "step-0").is_dir():
        train_drafter(str(tiny_target), str(folder), save_steps=(0,), samples=3, completion_len=16)
    return folder


def gt_inventory(make_inventory, eval_sshd, ssh_base, tiny_target, drafters, tmp_path, url, **role):
    """An eval host (loopback sshd) with its own workdir (so its ground-truth cache is this
    test's) and the ground truth at `url`; `role`: more keys of its eval role."""
    return make_inventory(
        hosts={
            "evalhost": ssh_host_entry(
                eval_sshd,
                ssh_base,
                workdir=str(tmp_path / "host-wd"),
                roles={
                    "eval": {
                        "drafters": str(drafters),
                        "target_model": str(tiny_target),
                        "ground_truth": url,
                        "dtype": "float32",
                        **role,
                    }
                },
            )
        },
        defaults={"eval_host": "evalhost", "results_dir": str(tmp_path / "results")},
    )


def remote_eval(inventory: Path, *args: str):
    return dflash(
        "remote-eval",
        "-c",
        "step-0",
        "--samples",
        "2",
        "--max-new-tokens",
        "8",
        "--budgets",
        "4",
        "-i",
        str(inventory),
        "--json",
        *args,
        timeout=300,
    )


def job_error(proc) -> str:
    """The one error line a failed job ends `remote-eval` with (after its "started" line,
    its outline and notes)."""
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error")]
    assert errors == [lines[-1]] and lines[-1].startswith("error: "), proc.stderr
    return lines[-1]


def host_cache(tmp_path: Path) -> list[str]:
    folder = tmp_path / "host-wd" / "groundtruth"
    return sorted(p.name for p in folder.glob("*.json*")) if folder.is_dir() else []


@pytest.mark.slow
def test_remote_eval_flags_wrong_ground_truth_keeps_no_cache_and_remakes_on_demand(
    tmp_path, make_inventory, eval_sshd, ssh_base, tiny_target, drafters, gt_server
):
    """A server answering in-vocabulary but wrong ids: the eval ends (its numbers are
    there) with the ground truth flagged (``suspect``, a warning) and nothing of it left in
    the host's cache. The server fixed, at the same URL and model: the next eval asks it
    again and is not flagged; --fresh-ground-truth remakes an entry that is fine."""
    wrong = ids_reply([5, 6, 7])

    def greedy(path: str, body: dict) -> dict:
        return ids_reply(gt_server.greedy(body["input_ids"], 8))(path, body)

    with ScriptedServer(wrong) as server:
        inv = gt_inventory(
            make_inventory, eval_sshd, ssh_base, tiny_target, drafters, tmp_path, server.url
        )
        first = remote_eval(inv)
        assert first.returncode == 0, first.stderr
        out = json.loads(first.stdout)
        result = json.loads((Path(out["run_dir"]) / "result.json").read_text())
        src = result["inputs"]["ground_truth_source"]
        assert src["suspect"]["agreement"] < 0.1 and src["suspect"]["evicted"] is True
        assert any("target agreement" in w for w in src["warnings"])
        assert host_cache(tmp_path) == []
        asked = len(server.requests)

        server.reply = greedy  # the operator fixes the server: same URL, same model
        second = remote_eval(inv)
        assert second.returncode == 0, second.stderr
        out = json.loads(second.stdout)
        assert out["summary"]["ground_truth_cached"] is False
        assert out["summary"]["target_agreement"] > 0.9
        result = json.loads((Path(out["run_dir"]) / "result.json").read_text())
        assert "suspect" not in result["inputs"]["ground_truth_source"]
        assert len(server.requests) == 2 * asked and len(host_cache(tmp_path)) == 2

        third = remote_eval(inv)
        assert json.loads(third.stdout)["summary"]["ground_truth_cached"] is True
        fresh = remote_eval(inv, "--fresh-ground-truth")
        assert fresh.returncode == 0, fresh.stderr
        assert json.loads(fresh.stdout)["summary"]["ground_truth_cached"] is False
        assert len(server.requests) == 3 * asked


@pytest.mark.slow
def test_remote_eval_deadlines_from_the_command_line_and_the_inventory(
    tmp_path, make_inventory, eval_sshd, ssh_base, tiny_target, drafters
):
    """A trickling server, through `remote-eval`: --gt-deadline ends it in one line naming
    the server; the inventory's ground_truth_phase_deadline the same way; a bad value is
    refused before anything connects."""
    with ScriptedServer(_trickled_ids) as trickle:
        inv = gt_inventory(
            make_inventory, eval_sshd, ssh_base, tiny_target, drafters, tmp_path, trickle.url
        )
        line = job_error(remote_eval(inv, "--gt-deadline", "1"))
        assert f"ground truth server {trickle.url}/generate" in line and "deadline of 1s" in line
        inv = gt_inventory(
            make_inventory,
            eval_sshd,
            ssh_base,
            tiny_target,
            drafters,
            tmp_path,
            trickle.url,
            ground_truth_phase_deadline=1,
        )
        line = job_error(remote_eval(inv))
        assert "phase" in line and "deadline of 1s" in line and trickle.url in line
    bad = remote_eval(inv, "--gt-timeout", "0")
    assert bad.returncode != 0
    assert "the ground-truth timeout" in one_error_line(bad)
    assert host_cache(tmp_path) == []


@pytest.mark.slow
def test_remote_eval_takes_a_prompt_file_named_as_people_name_files(
    tmp_path, make_inventory, eval_sshd, ssh_base, tiny_target, drafters, server, prompts_file
):
    """``mt bench (v2) ü.jsonl``: spaces, parentheses, unicode; carried with the job and
    evaluated. A name with a control character is refused before anything connects."""
    named = tmp_path / "mt bench (v2) ü.jsonl"
    named.write_text(prompts_file.read_text())
    inv = gt_inventory(
        make_inventory, eval_sshd, ssh_base, tiny_target, drafters, tmp_path, server.url
    )
    run = remote_eval(inv, "--prompts", str(named))
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["summary"]["prompts"] == "mt bench (v2) ü" and out["summary"]["samples"] == 2
    carried = list((tmp_path / "host-wd" / "prompts").iterdir())
    assert [p.name.split("-", 1)[1] for p in carried] == ["mt bench (v2) ü.jsonl"]
    odd = tmp_path / "tab\there.jsonl"
    odd.write_text(named.read_text())
    bad = remote_eval(inv, "--prompts", str(odd))
    assert bad.returncode != 0
    assert "holds a control character" in one_error_line(bad)


# ---- where the bounds and --fresh-ground-truth come from ----------------------------------


def _role_inventory(tmp_path: Path, **role) -> Path:
    import yaml

    path = tmp_path / "inventory.yaml"
    host = {
        "transport": "local",
        "roles": {"eval": {"drafters": "/d", "ground_truth": "http://h", **role}},
    }
    path.write_text(yaml.safe_dump({"hosts": {"e": host}, "defaults": {"eval_host": "e"}}))
    return path


def test_bounds_and_fresh_reach_the_job_from_the_options_or_the_inventory(tmp_path):
    from orchestrator.eval.spec import EvalOptions, ground_truth_source
    from orchestrator.inventory import InventoryError, load_inventory
    from remote.protocol import GT_DEFAULT_DEADLINE, GT_DEFAULT_PHASE_DEADLINE, GT_DEFAULT_TIMEOUT

    plain = load_inventory(_role_inventory(tmp_path)).host("e")
    gt = ground_truth_source(None, plain, EvalOptions())
    assert (gt["timeout"], gt["deadline"], gt["phase_deadline"]) == (
        GT_DEFAULT_TIMEOUT,
        GT_DEFAULT_DEADLINE,
        GT_DEFAULT_PHASE_DEADLINE,
    )
    assert not gt.get("fresh")
    role = load_inventory(
        _role_inventory(
            tmp_path,
            ground_truth_timeout=30,
            ground_truth_deadline=60,
            ground_truth_phase_deadline=600.5,
        )
    ).host("e")
    gt = ground_truth_source(None, role, EvalOptions())
    assert (gt["timeout"], gt["deadline"], gt["phase_deadline"]) == (30, 60, 600.5)
    chosen = EvalOptions(ground_truth_deadline=5, fresh_ground_truth=True)
    gt = ground_truth_source(None, role, chosen)
    assert (gt["timeout"], gt["deadline"], gt["fresh"]) == (30, 5, True)
    for value in (0, "soon", -3):
        with pytest.raises(InventoryError) as err:
            load_inventory(_role_inventory(tmp_path, ground_truth_deadline=value))
        line = str(err.value)
        assert "roles.eval.ground_truth_deadline" in line and "seconds" in line
        assert ":1:" in line or ".yaml:" in line


@pytest.mark.parametrize(
    "command",
    [
        ["remote-eval", "-c", "step-0"],
        ["follow", "--from", "e", "--to", "e", "--once"],
        ["parity", "--hosts", "e,e"],
    ],
    ids=["remote-eval", "follow", "parity"],
)
@pytest.mark.parametrize("option", ["--gt-timeout", "--gt-deadline", "--gt-phase-deadline"])
def test_every_command_that_fetches_ground_truth_takes_the_bounds(tmp_path, command, option):
    """remote-eval, follow and parity take the three bounds and --fresh-ground-truth; a bad
    bound is one line before anything connects (the host here is not even reachable)."""
    inv = _role_inventory(tmp_path)
    proc = dflash(*command, option, "0", "-i", str(inv))
    assert proc.returncode != 0
    label = option.removeprefix("--gt-").replace("-", " ")
    assert f"the ground-truth {label}" in one_error_line(proc)
    helped = dflash(*command[:1], "--help")
    for name in ("--gt-timeout", "--gt-deadline", "--gt-phase-deadline", "--fresh-ground-truth"):
        assert name in helped.stdout, (command[0], name)


def test_carried_file_names_are_names_people_use_and_nothing_that_leaves_the_folder(tmp_path):
    """One rule (`remote.protocol.carried_name_problem`) on both sides: the controller checks
    the name it builds, the host the name it is asked to write."""
    import base64
    import hashlib

    from remote.jobs import start as jobs
    from remote.protocol import carried_name_problem

    data = b'{"prompt": "hi"}\n'
    workdir = tmp_path / "wd"

    def item(name: str) -> dict:
        return {
            "path": f"{workdir}/prompts/{name}",
            "sha256": hashlib.sha256(data).hexdigest(),
            "data": base64.b64encode(data).decode(),
        }

    ok = ["419eef0bc4e96fa3-mt bench (v2).jsonl", "0a-ünïcødé 日本語 [draft] #2.jsonl", "x y.jsonl"]
    for name in ok:
        assert carried_name_problem(name) is None, name
        (written,) = jobs.write_carried(str(workdir), [item(name)])
        assert written.name == name and written.parent == (workdir / "prompts").resolve()
    bad = {
        "a/b.jsonl": "holds a '/'",
        "..": "'..' part",
        "a\x1bb.jsonl": "control character",
        "a\tb.jsonl": "control character",
        "a\nb.jsonl": "line break",
        "a\x00b": "NUL",
        "x\x85.jsonl": "control character",
        "\ud800.jsonl": "lone surrogate",
        "é" * 128 + ".jsonl": "longer than 255 bytes",
    }
    for name, why in bad.items():
        assert why in (carried_name_problem(name) or ""), name
        if "/" not in name and name != ".." and "\0" not in name:
            with pytest.raises(UserError, match="is not a plain name"):
                jobs.write_carried(str(workdir), [item(name)])
    assert sorted(p.name for p in (workdir / "prompts").iterdir()) == sorted(ok)


@pytest.mark.slow
def test_a_sharded_eval_flags_wrong_ground_truth_and_drops_it_from_the_first_hosts_cache(
    tmp_path, make_inventory, eval_sshd, trainer_sshd, ssh_base, tiny_target, drafters
):
    """`remote-eval --hosts`: the ground truth is made once on the first host and each shard
    evaluates a slice; the merged agreement judges it, and the entry the first host cached
    is dropped there."""
    role = {"drafters": str(drafters), "target_model": str(tiny_target), "dtype": "float32"}
    with ScriptedServer(ids_reply([5, 6, 7])) as wrong:
        inv = make_inventory(
            hosts={
                name: ssh_host_entry(
                    sshd,
                    ssh_base,
                    workdir=str(tmp_path / f"{name}-wd"),
                    roles={"eval": {**role, "ground_truth": wrong.url}},
                )
                for name, sshd in (("ea", eval_sshd), ("eb", trainer_sshd))
            },
            defaults={"results_dir": str(tmp_path / "results")},
        )
        run = dflash(
            "remote-eval", "-c", "step-0", "--hosts", "ea,eb", "--samples", "4",
            "--max-new-tokens", "8", "--budgets", "4", "-i", str(inv), "--json",
            timeout=400,
        )  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["hosts"] == ["ea", "eb"]
    result = json.loads((Path(out["run_dir"]) / "result.json").read_text())
    src = result["inputs"]["ground_truth_source"]
    assert src["suspect"]["evicted"] is True and src["suspect"]["agreement"] < 0.1
    assert "dropped from the host's cache" in src["warnings"][-1]
    assert list((tmp_path / "ea-wd" / "groundtruth").glob("*.json*")) == []


@pytest.mark.slow
def test_parity_flags_wrong_ground_truth_and_drops_it_from_the_cache(
    tmp_path, make_inventory, eval_sshd, trainer_sshd, ssh_base, tiny_target
):
    """`parity` makes its ground truth on B like an eval (the same cache): B's capture
    judges it by its own target's argmax, flags it and drops the entry."""
    from orchestrator.eval.parity import run as parity
    from orchestrator.inventory import load_inventory

    events = []
    with ScriptedServer(ids_reply([5, 6, 7])) as wrong:
        role = {"drafters": "/nowhere", "target_model": str(tiny_target), "ground_truth": wrong.url}
        inv = make_inventory(
            hosts={
                name: ssh_host_entry(
                    sshd, ssh_base, workdir=str(tmp_path / f"{name}-wd"), roles={"eval": role}
                )
                for name, sshd in (("pa", trainer_sshd), ("pb", eval_sshd))
            },
            defaults={"results_dir": str(tmp_path / "results")},
        )
        parity.run_parity(
            load_inventory(inv),
            "pa",
            "pb",
            parity.ParityOptions(samples=2, max_new_tokens=8),
            on_event=lambda stage, ev: events.append(ev),
        )
    assert list((tmp_path / "pb-wd" / "groundtruth").glob("*.json*")) == []
    (info,) = [
        json.loads(p.read_text())
        for p in (tmp_path / "pb-wd" / "jobs").glob("*/ground_truth.json")
        if json.loads(p.read_text()).get("cache_key")
    ]
    assert info["suspect"]["evicted"] is True
    assert any(
        ev.get("event") == "warning" and "target agreement" in ev["message"] for ev in events
    )


@pytest.mark.slow
def test_follow_fresh_ground_truth_remakes_it_for_the_first_checkpoint_only(
    tmp_path, make_inventory, trainer_sshd, eval_sshd, ssh_base, tiny_target, drafters, server
):
    """`follow --once --fresh-ground-truth` after an earlier follow cached the ground truth:
    the first new checkpoint's eval makes it again, the next one reuses that."""
    import shutil

    ckpts, relayed = tmp_path / "ckpts", tmp_path / "relayed"
    ckpts.mkdir()
    relayed.mkdir()

    def write(name: str) -> None:
        shutil.copytree(drafters / "step-0", ckpts / name)
        (ckpts / name / "COMPLETE").write_text("")

    role = {
        "drafters": str(relayed),
        "target_model": str(tiny_target),
        "ground_truth": server.url,
        "samples": 2,
        "max_new_tokens": 8,
        "dtype": "float32",
    }
    inv = make_inventory(
        hosts={
            "trainer": ssh_host_entry(
                trainer_sshd,
                ssh_base,
                roles={"trainer": {"checkpoints": str(ckpts), "complete_rule": "marker"}},
            ),
            "evalhost": ssh_host_entry(
                eval_sshd, ssh_base, workdir=str(tmp_path / "host-wd"), roles={"eval": role}
            ),
        },
        defaults={
            "relay_from": "trainer",
            "relay_to": "evalhost",
            "results_dir": str(tmp_path / "results"),
        },
    )

    def follow(*args: str) -> list[dict]:
        proc = dflash("follow", "--once", "--budgets", "4", "-i", str(inv), *args, timeout=600)
        assert proc.returncode == 0, proc.stderr
        runs = sorted((tmp_path / "results").glob("*/result.json"))
        return [json.loads(p.read_text())["inputs"]["ground_truth_source"] for p in runs]

    write("step-1")
    (first,) = follow()
    assert first["cached"] is False and len(server.requests) == 2
    write("step-2")
    write("step-3")
    sources = follow("--fresh-ground-truth")  # run folders are named by their start time
    assert [s["cached"] for s in sources] == [False, False, True]
    assert sources[1].get("fresh") is True and sources[2]["source"] == sources[1]["source"]
    assert len(server.requests) == 4  # made twice: once at first, once asked for
    assert len(host_cache(tmp_path)) == 2


@pytest.mark.parametrize("body", [b"", b"{cut", b"[1, 2]"], ids=["empty", "cut", "not-object"])
def test_the_demo_server_answers_a_body_that_is_no_json_object_with_400(server, capfd, body):
    """The demo's SGLang stand-in answers a request body that is not a JSON object (a
    client that hung up mid-request, a bad client) with a 400 naming it, as an engine
    does, and logs nothing: before, its thread printed a traceback into the test run."""
    req = urllib.request.Request(f"{server.url}/generate", data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 400
    assert "not a JSON object" in json.loads(err.value.read())["error"]
    assert server.requests == []
    with urllib.request.urlopen(f"{server.url}/health", timeout=10) as ok:
        assert ok.status == 200
    assert "Traceback" not in capfd.readouterr().err
