"""`dflash online` bounded as the inventory says on every path: ``--server URL`` keeps the
eval role's ``serve.start_timeout`` and ``serve.request_timeout`` (before, `serve_spec`
dropped them and a server that never answered was waited on for the 600 s default). Real
servers on loopback: a socket that accepts and never answers, and a scripted server that
takes each completion and never answers it, behind a loopback sshd eval host."""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager

import pytest

from orchestrator.eval.online.run import OnlineOptions
from remote.errors import UserError
from remote.online.server import wait_answering
from remote.online.spec import ServeSpec
from tests.helpers.cli import dflash
from tests.helpers.sshd import eval_host_inventory
from tests.helpers.vllm import vllm_models


def test_a_server_url_keeps_the_inventorys_timeouts():
    """``--server URL`` is bounded as the inventory says: its start and request timeouts
    hold for any server, not only one the job starts."""
    for role in (
        ServeSpec(engine="vllm", python="/opt/v/bin/python", start_timeout=5, request_timeout=20),
        ServeSpec(engine="sglang", url="http://10.0.0.1:1", start_timeout=5, request_timeout=20),
    ):
        got = OnlineOptions(server="http://127.0.0.1:8000").serve_spec(role)
        assert (got.url, got.python) == ("http://127.0.0.1:8000", None)
        assert (got.start_timeout, got.request_timeout) == (5.0, 20.0)


@contextmanager
def silent_server():
    """A real listening socket on loopback that accepts connections and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def test_a_running_server_that_never_answers_is_one_line_after_start_timeout():
    with silent_server() as url:
        with pytest.raises(UserError) as err:
            wait_answering(url, 1.5)
    line = str(err.value)
    assert f"the serving engine {url} did not answer within 1.5s" in line
    assert "roles.eval.serve.start_timeout" in line and "\n" not in line


@pytest.mark.slow
def test_a_server_that_never_answers_is_waited_on_only_as_long_as_configured(
    make_inventory, eval_sshd, ssh_base, tmp_path
):
    """``--server URL`` against a real loopback server that takes each completion and never
    answers it: the job ends at the inventory's ``request_timeout`` (2 s), in one line,
    not at the 600 s default."""
    from orchestrator.demo.servers import ScriptedServer

    models = vllm_models()  # the models only: nothing here needs vLLM
    hold = threading.Event()

    def never(path: str, body: dict) -> dict:
        hold.wait(120)
        return {}

    server = ScriptedServer(never)
    try:
        drafter = models.drafters["one-layer"][-1]
        role = {
            "drafters": str(drafter.parent),
            "target_model": str(models.target),
            "ground_truth": str(models.ground_truth),
            "ground_truth_kind": "file",
            "dtype": "float32",
            "threads": 1,
            "samples": 2,
            "serve": {
                "engine": "sglang",
                "url": "http://127.0.0.1:1",
                "request_timeout": 2,
                "start_timeout": 60,
            },
        }
        inv = eval_host_inventory(make_inventory, eval_sshd, ssh_base, role, tmp_path / "res")
        run = dflash(
            "online", "-c", drafter.name, "--server", server.url, "-i", str(inv), timeout=300
        )
    finally:
        hold.set()
        server.stop()
    assert run.returncode != 0 and "Traceback" not in run.stderr
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith("error: online job") and server.url in line, line
    assert "timeout of 2s" in line, line
    # what was asked before the bound ended it (the job's two samples, at most)
    assert {p for p, _ in server.requests} == {"/generate"} and len(server.requests) <= 2
