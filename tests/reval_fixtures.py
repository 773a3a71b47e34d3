"""Fixtures for the remote-eval tests: a tiny real target (with tokenizer and chat template),
a ground-truth HTTP server over it, and a prompts file in both accepted forms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    from orchestrator.demo.models import build_qwen3_target

    return Path(build_qwen3_target(str(tmp_path_factory.mktemp("models") / "qwen3-tiny")))


@pytest.fixture(scope="session")
def gt_server(tiny_target):
    from orchestrator.demo.gtserver import GroundTruthServer

    server = GroundTruthServer(str(tiny_target))
    yield server
    server.stop()


@pytest.fixture
def server(gt_server):
    """The shared server, healthy and with an empty request log for this test."""
    gt_server.mode = "ok"
    gt_server.requests.clear()
    yield gt_server
    gt_server.mode = "ok"


@pytest.fixture(scope="session")
def prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "mixed.jsonl"
    rows = [
        {"turns": ["What is two plus two?"]},
        {"prompt": "Write a haiku about rain."},
        {"id": "custom", "turns": ["Name three colours.", "And three more?"]},
        {"prompt": "def add(a, b):"},
        {"prompt": "The quick brown fox"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
