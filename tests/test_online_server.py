"""The online job's serving-engine process (`remote.online.server.Server`) outlives no
runner: a stdlib HTTP server stands in for vLLM, the process that started it is killed
outright, and the server must be gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from remote.online.server import _alive

RUNNER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from remote.online.server import Server, free_port
    port = free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    server = Server(argv, {}, Path(sys.argv[1]), f"http://127.0.0.1:{port}")
    print(server.proc.pid, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_runner_killed_outright_takes_its_server_with_it(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(tmp_path / "server.log")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
        start_new_session=True,  # the server is not in the test's group: only the signal can end it
    )
    try:
        server_pid = int(runner.stdout.readline())
        assert _alive(server_pid)
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server_pid), "the server outlived the runner that started it"
    finally:
        runner.kill()
        try:
            os.killpg(runner.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
