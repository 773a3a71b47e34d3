"""Shared fixtures: real loopback sshd hosts, inventories that point at them, and a tiny
real target with a ground-truth server over it.

Session-scoped: one user key, and two sshd servers acting as the trainer (`trainer`) and
the eval host (`evalhost`), each with its own root folder. `make_inventory` writes an
inventory for any set of those servers plus local hosts. The helpers these fixtures build on
live in `tests/helpers/`, which test modules import directly.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests.helpers.relay import TEnv
from tests.helpers.sshd import clear_stale_pyenv_lock, keygen, ssh_host_entry, start_sshd


def pytest_configure(config) -> None:
    """Take SIGINT back if it came in ignored: a shell without job control starts background
    commands so (``bash .ci/run &``), every child would inherit it, and the tests that stop
    a relay or follow with Ctrl-C would wait out their timeouts. A handler, unlike an
    ignore, resets to the default in the children."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list) -> None:
    """The files with the most `slow` tests first, each file's tests kept together and in
    order: the workers of `scripts/test.sh` take a file at a time, and a long file taken
    last would leave one worker running it alone."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.path])


@pytest.fixture(autouse=True)
def _no_stale_pyenv_lock():
    """Tests that kill SSH sessions can leave pyenv's rehash lock behind (see helpers/sshd.py)."""
    clear_stale_pyenv_lock()
    yield
    clear_stale_pyenv_lock()


@pytest.fixture(scope="session")
def ssh_base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ssh")


@pytest.fixture(scope="session")
def user_key(ssh_base) -> Path:
    key = keygen(ssh_base / "id_test")
    (ssh_base / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    return key


@pytest.fixture(scope="session")
def trainer_sshd(ssh_base, user_key):
    server = start_sshd(ssh_base, "trainer")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def eval_sshd(ssh_base, user_key):
    server = start_sshd(ssh_base, "evalhost")
    yield server
    server.stop()


@pytest.fixture
def make_inventory(tmp_path, ssh_base):
    """Write an inventory: ``make_inventory(hosts={"name": entry_dict}, defaults={...})``."""

    def write(hosts: dict, defaults: dict | None = None, groups: dict | None = None) -> Path:
        doc = {"hosts": hosts}
        if defaults:
            doc["defaults"] = defaults
        if groups:
            doc["groups"] = groups
        path = tmp_path / "inventory.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    return write


@pytest.fixture
def two_hosts(trainer_sshd, eval_sshd, ssh_base, make_inventory):
    """An inventory with the trainer and eval sshd hosts in their roles; returns its path."""
    ckpt = trainer_sshd.root / "checkpoints"
    ckpt.mkdir(exist_ok=True)
    drafters = eval_sshd.root / "drafters"
    drafters.mkdir(exist_ok=True)
    return make_inventory(
        hosts={
            "trainer": ssh_host_entry(
                trainer_sshd, ssh_base, roles={"trainer": {"checkpoints": str(ckpt)}}
            ),
            "evalhost": ssh_host_entry(
                eval_sshd, ssh_base, roles={"eval": {"drafters": str(drafters)}}
            ),
        },
        defaults={"relay_from": "trainer", "relay_to": "evalhost", "eval_host": "evalhost"},
    )


@pytest.fixture
def tenv(trainer_sshd, eval_sshd, ssh_base, tmp_path) -> TEnv:
    """A relay test's own folders on the trainer and eval hosts (`tests/helpers/relay.py`)."""
    return TEnv(trainer_sshd, eval_sshd, ssh_base, tmp_path)


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory) -> Path:
    """A demo model cache (`DFLASH_CACHE_DIR`): the demo's tiny target and its drafter's
    checkpoints, built once per session through the demo's own builder."""
    from orchestrator.demo.build import ensure_assets

    base = tmp_path_factory.mktemp("dflash-cache")
    ensure_assets(base=base)
    return base


# ---- remote eval: a tiny real target (tokenizer, chat template), a ground-truth server ----


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
    """A prompts file in both accepted forms (``turns`` lists and single ``prompt``s)."""
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


# ---- eval hosts' drafters and role; the loopback Slurm cluster (tests/helpers/slurm.py) ----


@pytest.fixture(scope="session")
def trained_drafters(tiny_target, tmp_path_factory) -> Path:
    """A tiny drafter trained for real, checkpoints ``step-6`` and ``step-12``; every host
    (and every compute node of the loopback cluster) reads the same folder: one machine."""
    from orchestrator.demo.train import train_drafter

    out = tmp_path_factory.mktemp("drafters")
    train_drafter(
        str(tiny_target),
        str(out),
        save_steps=(6, 12),
        samples=6,
        batch_samples=3,
        completion_len=24,
    )
    return out


@pytest.fixture
def eval_role(trained_drafters, tiny_target, gt_server):
    """``eval_role(**over)``: an eval role over the tiny target, the trained drafters and
    the ground-truth server, float32 on one thread; `over` replaces or adds keys."""

    def role(**over) -> dict:
        return {
            "drafters": str(trained_drafters),
            "target_model": str(tiny_target),
            "ground_truth": gt_server.url,
            "ground_truth_kind": "sglang",
            "dtype": "float32",
            "threads": 1,
            **over,
        }

    return role


@pytest.fixture(scope="session")
def slurm_cluster():
    """One loopback Slurm cluster (munged, slurmctld, two slurmd) for the whole session:
    every Slurm test module runs on it (`cluster` leaves it as found after each test)."""
    from tests.helpers.slurm import SlurmCluster, require_slurm

    require_slurm()
    c = SlurmCluster.start(nodes=2, cpus=2, memory_mb=2048)
    yield c
    c.stop()


@pytest.fixture
def cluster(slurm_cluster):
    """The session's Slurm cluster, left as found after the test: nothing queued, every
    node up again, whatever the test cancelled or put down."""
    yield slurm_cluster
    slurm_cluster.drain_queue()
    slurm_cluster.resume_nodes()


@pytest.fixture(scope="session")
def slurm_login(slurm_cluster, ssh_base, user_key):
    """The cluster's login node: an sshd whose sessions have the cluster's SLURM_CONF."""
    server = start_sshd(ssh_base, "slurm-login", slurm_cluster.login_sshd_config())
    yield server
    server.stop()
