"""README.md is a front door that works: every command it shows is run by a test, and its
tour runs as written, with README's own inventory, on two real loopback sshd hosts.

Commands are the lines of README's ```sh blocks. The tour (the block under "Your own two
hosts") is run here, command by command, from the folder holding README's inventory; that
inventory gets only what loopback needs on top (address, port, key, an empty known_hosts
file for a real first contact, the test's folders, a small eval). Commands README shows
elsewhere name the file that runs them (`ELSEWHERE`), and that file must contain them.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.inventory import parse_inventory
from tests.helpers.cli import ROOT, dflash
from tests.helpers.sshd import ssh_host_entry

README = ROOT / "README.md"
TOUR = "Your own two hosts"
# README commands run outside this module: the file that runs each, which must contain it.
ELSEWHERE = {
    "bash scripts/demo.sh": "tests/test_demo.py",
    "bash scripts/test.sh": ".ci/run",
}
# What the loopback hosts add to README's inventory: the way in, and sizes for a quick eval.
CONNECTION = ("hostname", "port", "user", "identity_file", "workdir", "connect_timeout")
SMALL_EVAL = {"samples": 3, "max_new_tokens": 24, "threads": 1}


def blocks(text: str) -> list[tuple[str, str, str]]:
    """(section heading, language, body) of each fenced code block in `text`."""
    out, section = [], ""
    for m in re.finditer(r"^(#{1,6}) ([^\n]+)$|^```(\w*)\n(.*?)^```$", text, re.M | re.S):
        if m.group(1):
            section = m.group(2).strip()
        else:
            out.append((section, m.group(3), m.group(4)))
    return out


def commands(text: str) -> list[tuple[str, str]]:
    """(section, command) for each line of the ```sh blocks, its trailing comment cut."""
    out = []
    for section, lang, body in blocks(text):
        if lang == "sh":
            for line in body.splitlines():
                command = re.sub(r"\s+#.*$", "", line).strip()
                if command and not command.startswith("#"):
                    out.append((section, command))
    return out


def readme_inventory(text: str) -> str:
    [body] = [b for s, lang, b in blocks(text) if s == TOUR and lang == "yaml"]
    return body


def test_every_readme_command_is_run_by_a_test():
    text = README.read_text()
    found = commands(text)
    assert ("Two commands", "bash scripts/demo.sh") in found  # the parser finds them
    tour = [c for s, c in found if s == TOUR]
    assert len(tour) >= 5 and all(c.startswith("dflash ") for c in tour), tour
    for section, command in found:
        if section == TOUR:
            continue  # test_the_tour_runs_as_written runs each one
        runner = ELSEWHERE.get(command)
        assert runner, f"README ({section}) shows `{command}`, which no test runs"
        assert command in (ROOT / runner).read_text(), f"{runner} does not run `{command}`"


def test_readme_is_a_front_door_and_every_link_leads_somewhere():
    """README stays short (what it is, two commands, your own hosts, links); the rest lives
    in docs/ and benchmarks/, and every local link in any of them finds its file."""
    assert len(README.read_text().splitlines()) <= 210
    pages = [README, ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)#]+)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name} links to {target}"


def test_the_clone_s_example_inventory_is_readme_s():
    """What README says to save as inventory.yaml is what the clone ships to copy there."""
    shipped = yaml.safe_load((ROOT / "inventory.example.yaml").read_text())
    assert shipped == yaml.safe_load(readme_inventory(README.read_text()))


def test_every_inventory_the_docs_show_is_valid():
    """README's inventory and each one in docs/ parse as they are written."""
    shown = [(README, readme_inventory(README.read_text()))]
    for doc in sorted((ROOT / "docs").glob("*.md")):
        shown += [(doc, b) for _, lang, b in blocks(doc.read_text()) if lang == "yaml"]
    assert len(shown) >= 2
    for path, body in shown:
        inv = parse_inventory(body, path)
        assert inv.hosts, path


@pytest.fixture
def tour_folder(demo_cache, trainer_sshd, eval_sshd, ssh_base, tmp_path) -> Path:
    """A folder holding README's inventory, pointed at the loopback hosts, with one demo
    drafter checkpoint on the trainer under the name README's tour evaluates."""
    from orchestrator.demo.build import ensure_assets

    text = README.read_text()
    doc = yaml.safe_load(readme_inventory(text))
    trainer, evalbox = doc["defaults"]["relay_from"], doc["defaults"]["eval_host"]
    [name] = {m.group(1) for _, c in commands(text) for m in re.finditer(r"--checkpoint (\S+)", c)}
    assets = ensure_assets(base=demo_cache)
    ckpts = trainer_sshd.root / f"readme-{tmp_path.name}" / "checkpoints"
    shutil.copytree(assets.checkpoints[-1], ckpts / name)  # mtimes kept: it is complete
    known_hosts = tmp_path / "known_hosts"  # empty: the tour's first contact is a real one
    known_hosts.write_text("")
    for host, server in ((trainer, trainer_sshd), (evalbox, eval_sshd)):
        entry = ssh_host_entry(server, ssh_base, known_hosts=str(known_hosts))
        doc["hosts"][host].update({k: entry[k] for k in (*CONNECTION, "known_hosts")})
    assert "python" not in doc["hosts"][trainer]  # README's trainer runs python3 over SSH
    assert doc["hosts"][evalbox]["python"]  # and names the eval host's python, replaced by
    doc["hosts"][evalbox]["python"] = sys.executable  # this one (torch, transformers)
    doc["hosts"][trainer]["roles"]["trainer"]["checkpoints"] = str(ckpts)
    role = doc["hosts"][evalbox]["roles"]["eval"]
    assert role["ground_truth_kind"] == "local" and "ground_truth" not in role
    drafters = eval_sshd.root / f"readme-{tmp_path.name}" / "drafters"
    drafters.mkdir(parents=True)
    role.update(drafters=str(drafters), target_model=str(assets.target), **SMALL_EVAL)
    folder = tmp_path / "workstation"
    folder.mkdir()
    (folder / "inventory.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


@pytest.mark.slow
def test_the_tour_runs_as_written(tour_folder):
    """README's tour, each command as README writes it, from the inventory's folder: first
    contact is refused without the opt-in and works with it, the newest checkpoint is
    relayed, probed and evaluated with local ground truth, and the results list shows it."""
    tour = [c for s, c in commands(README.read_text()) if s == TOUR]
    env = {"DFLASH_INVENTORY": "", "COLUMNS": "200"}
    first = dflash("hosts", "check", cwd=tour_folder, env=env)
    assert first.returncode != 0 and "Traceback" not in first.stderr
    assert "unknown host key" in first.stderr and "--accept-new-host-keys" in first.stderr
    assert (tour_folder.parent / "known_hosts").read_text() == ""
    outputs = {}
    for command in tour:
        argv = shlex.split(command)
        assert argv[0] == "dflash", command
        proc = dflash(*argv[1:], cwd=tour_folder, env=env, timeout=600)
        assert proc.returncode == 0, f"`{command}` failed:\n{proc.stdout}\n{proc.stderr}"
        outputs[command] = proc.stdout
    runs = [p for p in (tour_folder / "results").iterdir() if (p / "result.json").is_file()]
    [run] = runs
    result = json.loads((run / "result.json").read_text())
    assert result["inputs"]["ground_truth_source"]["kind"] == "local"
    assert result["metrics"]["tau_per_sample_mean"] >= 1.0
    listing = next(out for c, out in outputs.items() if c.startswith("dflash results list"))
    assert run.name in listing  # the full run id, as the table shows it
    jobs = next(out for c, out in outputs.items() if c.startswith("dflash jobs list"))
    assert run.name in jobs and "done" in jobs  # the job that made it, on evalbox
