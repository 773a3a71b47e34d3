"""Results where drafter teams look, from a real `dflash follow` over loopback sshd hosts:
TensorBoard and offline W&B runs read back with their own readers, paired comparisons,
exports, the HTML report in a real headless Chromium, and the results CLI's UX.

One follow pass makes the runs every test here reads: the demo's three checkpoints of a
tiny drafter trained for real (tau rises with the step, so deltas are real), relayed from
the trainer host, evaluated on the eval host against a real ground-truth HTTP server over
the demo's target.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.cli import ROOT
from tests.helpers.cli import dflash as run_cli
from tests.helpers.sshd import ssh_host_entry

pytestmark = pytest.mark.slow
PROJECT = "dflash-test"


def dflash(
    *args: str, cwd: Path | str = ROOT, columns: int = 100, timeout: float = 300
) -> subprocess.CompletedProcess:
    """The CLI at `columns` wide, with W&B offline (its files are read back here)."""
    env = {"COLUMNS": str(columns), "WANDB_MODE": "offline"}
    return run_cli(*args, env=env, timeout=timeout, cwd=cwd)


def wandb_records(path: Path):
    """Records of a ``.wandb`` file: W&B's header, then LevelDB-log records (32 KiB blocks,
    7-byte headers) each holding a protobuf parsed with wandb's own ``Record`` message."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<H", data[4:6])[0] == 0xBEE1, path
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and length == 0:
            break
        buf += data[pos : pos + length]
        pos += length
        if kind in (1, 4):  # FULL, LAST
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def wandb_history(folder: Path) -> tuple[list[str], list[dict]]:
    """(projects, history rows) of every offline run under `folder`."""
    projects, rows = [], []
    for f in sorted(folder.glob("wandb/offline-run-*/run-*.wandb")):
        for rec in wandb_records(f):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                projects.append(rec.run.project)
            elif kind == "history":
                rows.append(
                    {
                        i.key or "/".join(i.nested_key): json.loads(i.value_json)
                        for i in rec.history.item
                    }
                )
    return projects, rows


def tensorboard_scalars(logdir: Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{series folder: {tag: [(step, value)]}} read with TensorBoard's event reader."""
    from tensorboard.backend.event_processing import event_accumulator

    out = {}
    for d in sorted(p for p in logdir.iterdir() if p.is_dir()):
        acc = event_accumulator.EventAccumulator(str(d))
        acc.Reload()
        out[d.name] = {
            t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]
        }
    return out


def listing_sha256(folder: Path) -> str:
    """What ``sha256sum`` of every file, piped into ``sha256sum``, prints (computed here
    independently of remote/eval/provenance.py)."""
    lines = []
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.name.startswith(".dflash-"):
            rel = p.relative_to(folder).as_posix()
            lines.append(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {rel}\n")
    return hashlib.sha256("".join(sorted(lines, key=lambda s: s[66:])).encode()).hexdigest()


class Followed:
    def __init__(
        self,
        inventory: Path,
        ckpts: Path,
        results: Path,
        state: Path,
        tb: Path,
        history: list[dict],
    ):
        self.inventory, self.ckpts, self.results = inventory, ckpts, results
        self.state, self.tb, self.history = state, tb, history

    def run_ids(self) -> list[str]:
        return [h["run_id"] for h in sorted(self.history, key=lambda h: h["step"])]


@pytest.fixture(scope="module")
def demo():
    """The demo's cached target and drafter checkpoints (built once when missing), and a
    ground-truth server over that target."""
    from orchestrator.demo.build import ensure_assets
    from orchestrator.demo.gtserver import GroundTruthServer

    assets = ensure_assets()
    with GroundTruthServer(str(assets.target)) as server:
        yield assets, server


@pytest.fixture(scope="module")
def drafter_ckpts(demo) -> dict[str, Path]:
    return {p.name: p for p in demo[0].checkpoints}


@pytest.fixture(scope="module")
def followed(trainer_sshd, eval_sshd, ssh_base, demo, drafter_ckpts, tmp_path_factory):
    """One follow pass over three checkpoints with TensorBoard and W&B (offline) logging.
    The inventory names its results folder RELATIVELY: it lives beside the inventory."""
    from orchestrator.eval import run as remote_eval
    from orchestrator.eval.follow import loop as follow
    from orchestrator.inventory import load_inventory
    from remote.protocol import EvalSpec

    assets, gt_server = demo
    tiny_target = assets.target
    base = tmp_path_factory.mktemp("results-follow")
    ckpts = trainer_sshd.root / "team-a-run" / "checkpoints"
    drafters = eval_sshd.root / "results-drafters"
    ckpts.mkdir(parents=True)
    drafters.mkdir()
    for name, src in drafter_ckpts.items():
        shutil.copytree(src, ckpts / name)
        (ckpts / name / "COMPLETE").write_text("")
    inv_path = base / "inventory.yaml"
    inv_path.write_text(
        yaml.safe_dump(
            {
                "hosts": {
                    "trainer": ssh_host_entry(
                        trainer_sshd,
                        ssh_base,
                        roles={"trainer": {"checkpoints": str(ckpts), "complete_rule": "marker"}},
                    ),
                    "evalhost": ssh_host_entry(
                        eval_sshd,
                        ssh_base,
                        workdir=str(eval_sshd.root / "wd-results"),
                        roles={
                            "eval": {
                                "drafters": str(drafters),
                                "target_model": str(tiny_target),
                                "ground_truth": gt_server.url,
                                "ground_truth_kind": "sglang",
                                "samples": 4,
                                "max_new_tokens": 32,
                                "dtype": "float32",
                                "threads": 1,
                            }
                        },
                    ),
                },
                "defaults": {
                    "relay_from": "trainer",
                    "relay_to": "evalhost",
                    "results_dir": "results",
                },
            }
        )
    )
    inv = load_inventory(inv_path)
    tb = base / "tb"
    old = os.environ.pop("WANDB_MODE", None)  # the default must be offline by itself
    try:
        opts = follow.FollowOptions(
            tensorboard=str(tb),
            wandb=PROJECT,
            eval=remote_eval.EvalOptions(engine=EvalSpec(budgets=(2, 4))),
        )
        follow.follow_pass(inv, "trainer", "evalhost", opts)
    finally:
        if old is not None:
            os.environ["WANDB_MODE"] = old
    state = follow.state_dir(inv, "trainer", "evalhost")
    history = follow.read_history(state)
    assert [h["state"] for h in history] == ["done"] * 3, history
    return Followed(inv_path, ckpts, base / "results", state, tb, history)


# ---- trackers --------------------------------------------------------------------------


def test_follow_shows_up_in_tensorboard_with_tau_per_step(followed):
    series = tensorboard_scalars(followed.tb)
    assert len(series) == 1, series  # one training run: one TensorBoard run
    ((name, tags),) = series.items()
    assert name.startswith("team-a-run-trainer-chat-sglang-")
    by_step = {h["step"]: h for h in followed.history}
    assert [s for s, _ in tags["tau_per_sample_mean"]] == sorted(by_step)
    for tag in ("tau_per_sample_mean", "tau_token_weighted", "target_agreement"):
        key = tag  # one name everywhere: the tracker's tag is the history's key
        for step, value in tags[tag]:
            assert value == pytest.approx(by_step[step][key], rel=1e-6), (tag, step)
    for budget in ("2", "4"):
        got = dict(tags[f"tau_per_sample_mean/ddtree_{budget}"])
        assert got == {s: pytest.approx(h["ddtree"][budget], rel=1e-6) for s, h in by_step.items()}


def test_follow_shows_up_in_an_offline_wandb_run_with_tau_per_step(followed):
    projects, rows = wandb_history(followed.state)  # offline files in the follow folder
    assert projects == [PROJECT]
    by_step = {h["step"]: h for h in followed.history}
    assert sorted(r["train/step"] for r in rows) == sorted(by_step)
    for r in rows:
        h = by_step[r["train/step"]]
        assert r["tau_per_sample_mean"] == pytest.approx(h["tau_per_sample_mean"])
        assert r["tau_token_weighted"] == pytest.approx(h["tau_token_weighted"])
        assert r["tau_per_sample_mean/ddtree_4"] == pytest.approx(h["ddtree"]["4"])
        assert r["target_agreement"] == pytest.approx(h["target_agreement"])


# ---- what a result records -------------------------------------------------------------


def test_every_result_records_the_drafter_sha256_step_and_training_run(followed):
    from orchestrator.results import store as res
    from remote.protocol import check_files

    proc = dflash("results", "list", "-i", str(followed.inventory), "--json", cwd="/")
    assert proc.returncode == 0, proc.stderr
    listed = {s["run_id"]: s for s in json.loads(proc.stdout)}  # relative results_dir
    assert sorted(listed) == sorted(followed.run_ids())
    for h in followed.history:
        s = listed[h["run_id"]]
        assert s["engine"] == "dflash offline walk (remote.eval.engine)"
        assert s["step"] == h["step"]
        assert s["drafter_sha256"] == listing_sha256(followed.ckpts / h["checkpoint"])
        assert (s["trainer"], s["checkpoints_folder"], s["training_run"]) == (
            "trainer",
            str(followed.ckpts),
            "team-a-run",
        )
        run = res.load_run(followed.results / h["run_id"])
        # What a real eval leaves has the contract's types (remote.protocol.results), as pulled.
        check_files({p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()})
        assert run.drafter["hashed_by"] == "relay manifest"
        assert run.drafter["step_from"] == "relay manifest"
    # Distinct checkpoints, distinct digests.
    assert len({s["drafter_sha256"] for s in listed.values()}) == 3


def test_provenance_hashes_what_has_no_manifest_and_prefers_the_trainers_step(
    drafter_ckpts, tmp_path
):
    from remote.eval import provenance

    ckpt = tmp_path / "ckpt"
    shutil.copytree(next(iter(drafter_ckpts.values())), ckpt)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 777}))
    ident = provenance.drafter_identity(str(ckpt))
    assert ident["hashed_by"] == "eval host" and ident["relayed"] is False
    assert ident["sha256"] == listing_sha256(ckpt)
    assert (ident["step"], ident["step_from"]) == (777, "trainer_state.json")
    # A manifest whose sizes no longer match the files is not trusted: hashed afresh.
    files = [{"path": f["path"], "sha256": "0" * 64, "size": 1} for f in ident["files"]]
    (ckpt / ".dflash-manifest.json").write_text(json.dumps({"files": files, "step": 5}))
    again = provenance.drafter_identity(str(ckpt))
    assert again["hashed_by"] == "eval host" and again["sha256"] == ident["sha256"]


# ---- paired comparison -----------------------------------------------------------------


def test_compare_prints_a_paired_delta_with_its_interval(followed):
    first, _, last = followed.run_ids()
    proc = dflash(
        "results", "compare", first[:22], last, "-i", str(followed.inventory), "--json", cwd="/"
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    (p,) = out["paired"]
    assert p["comparable"] is True and p["problems"] == [] and p["samples"] == 4
    tau = next(d for d in p["deltas"] if d["label"] == "tau")
    assert (tau["metric"], tau["budget"]) == ("tau_per_sample_mean", None)
    assert tau["low"] <= tau["delta"] <= tau["high"]
    assert tau["delta"] == pytest.approx(tau["mean_b"] - tau["mean_a"])
    assert tau["improved"] + tau["worse"] + tau["tied"] == pytest.approx(1.0)
    # The demo's drafter really improves from step 0 to its last step.
    assert tau["delta"] > 0.3 and tau["low"] > 0 and tau["improved"] >= 0.75
    assert {d["label"] for d in p["deltas"]} == {"tau", "DDTree-2 tau", "DDTree-4 tau"}
    again = json.loads(
        dflash(
            "results", "compare", first, last, "-i", str(followed.inventory), "--json", cwd="/"
        ).stdout
    )
    assert again["paired"] == out["paired"]  # seeded: the same interval every time
    text = dflash("results", "compare", first, last, "-i", str(followed.inventory), cwd="/")
    assert text.returncode == 0, text.stderr
    assert re.search(
        r"tau\s+\d\.\d{3}\s+\d\.\d{3}\s+[+-]\d\.\d{3}\s+\[[+-]\d\.\d{3}, "
        r"[+-]\d\.\d{3}\]\s+\d+\.\d%",
        text.stdout,
    ), text.stdout
    assert max(len(line) for line in text.stdout.splitlines()) <= 100


def test_compare_says_when_runs_are_not_comparable(followed, tmp_path):
    """Another dtype (typed as bf16, evaluated for real) and other prompts."""
    from orchestrator.results import compare
    from orchestrator.results import store as res

    last = followed.history[-1]
    proc = dflash(
        "remote-eval",
        "--checkpoint",
        last["checkpoint"],
        "--dtype",
        "bf16",
        "--budgets",
        "2",
        "-i",
        str(followed.inventory),
        "--json",
        "--results-dir",
        str(tmp_path / "bf16"),
        cwd="/",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    bf16 = res.load_run(json.loads(proc.stdout)["run_dir"])
    assert bf16.spec["eval"]["dtype"] == "bfloat16"
    assert bf16.result["environment"]["dtype"] == "bfloat16"
    base = res.load_run(followed.results / last["run_id"])
    p = compare.paired(base, bf16)
    assert not p.comparable and p.deltas == []
    assert any(x.startswith("different dtype: float32 vs bfloat16") for x in p.problems)

    other = tmp_path / "other-prompts"
    shutil.copytree(base.path, other)
    spec = json.loads((other / "spec.json").read_text())
    spec["prompts"]["sha256"] = "f" * 64
    (other / "spec.json").write_text(json.dumps(spec))
    problems = compare.comparability(base, res.load_run(other))
    assert problems and problems[0].startswith("different prompts")
    text = dflash("results", "compare", str(base.path), str(other), cwd="/")
    assert text.returncode == 0, text.stderr
    assert "B vs A: not comparable: different prompts" in text.stdout


def test_bootstrap_interval_is_seeded_and_covers_the_mean():
    from orchestrator.results.compare import bootstrap_interval

    diffs = [0.1, 0.4, -0.2, 0.3, 0.0, 0.5, 0.2, 0.1]
    lo, hi = bootstrap_interval(diffs, 2000, seed=3)
    assert lo < sum(diffs) / len(diffs) < hi
    assert (lo, hi) == bootstrap_interval(diffs, 2000, seed=3)
    assert bootstrap_interval([0.25], 2000) == (0.25, 0.25)


def test_compare_writes_a_plot_only_where_asked(followed, tmp_path):
    first, _, last = followed.run_ids()
    before = sorted(p.name for p in followed.results.glob("*.png"))
    assert (
        dflash("results", "compare", first, last, "-i", str(followed.inventory), cwd="/").returncode
        == 0
    )
    assert sorted(p.name for p in followed.results.glob("*.png")) == before
    assert not list(followed.results.glob("compare_*"))
    plot = tmp_path / "mine.png"
    proc = dflash(
        "results",
        "compare",
        first,
        last,
        "-i",
        str(followed.inventory),
        "--plot",
        str(plot),
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- exports ---------------------------------------------------------------------------


def test_export_csv_jsonl_tensorboard_and_wandb(followed, tmp_path):
    inv = str(followed.inventory)
    ids = followed.run_ids()
    assert (
        dflash(
            "results", "export", "-f", "csv", "-o", str(tmp_path / "r.csv"), "-i", inv, cwd=tmp_path
        ).returncode
        == 0
    )
    with open(tmp_path / "r.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["run_id"] for r in rows] == ids
    tau = ("tau_per_sample_mean", "tau_token_weighted")
    dd = ("tau_per_sample_mean_ddtree_2", "tau_per_sample_mean_ddtree_4")
    assert {*tau, *dd, "drafter_sha256", "step"} <= set(rows[0])
    assert (
        dflash(
            "results",
            "export",
            ids[0],
            ids[2],
            "-f",
            "jsonl",
            "-o",
            str(tmp_path / "r.jsonl"),
            "-i",
            inv,
            cwd=tmp_path,
        ).returncode
        == 0
    )
    lines = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [x["run_id"] for x in lines] == [ids[0], ids[2]]
    by_step = {h["step"]: h for h in followed.history}
    tau = lines[1]["tau_per_sample_mean"]
    assert tau == pytest.approx(by_step[lines[1]["step"]]["tau_per_sample_mean"])

    proc = dflash(
        "results",
        "export",
        "-f",
        "tensorboard",
        "-o",
        str(tmp_path / "tb"),
        "-i",
        inv,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    (tags,) = tensorboard_scalars(tmp_path / "tb").values()
    assert [s for s, _ in tags["tau_per_sample_mean"]] == sorted(by_step)

    proc = dflash(
        "results",
        "export",
        "-f",
        "wandb",
        "-o",
        str(tmp_path / "wb" / "exp"),
        "-i",
        inv,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    projects, rows = wandb_history(tmp_path / "wb")
    assert projects == ["exp"]
    assert sorted(r["train/step"] for r in rows) == sorted(by_step)


def test_a_missing_tracker_library_is_one_clear_line(followed, tmp_path):
    code = (
        "import sys; sys.modules['tensorboard'] = None\n"
        "from orchestrator.cli import main\n"
        "sys.argv = ['dflash', 'results', 'export', '-f', 'tensorboard', '-o', "
        f"'{tmp_path}/tb', '--results-dir', '{followed.results}']\n"
        "main()"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == ["error: TensorBoard export needs tensorboard: pip install tensorboard"], (
        proc.stderr
    )
    assert not (tmp_path / "tb").exists()


# ---- the HTML report in a real browser -------------------------------------------------

CHECK_SCRIPT = """<script>
const out = [];
document.querySelectorAll('figure[data-plot] svg').forEach(svg => {
  const data = [...svg.querySelectorAll('[id^="data-"]')];
  const boxes = data.map(g => g.getBoundingClientRect());
  out.push({plot: svg.closest('figure').dataset.plot,
            width: svg.getBoundingClientRect().width, data: data.length,
            drawn: boxes.filter(b => b.width > 0 || b.height > 0).length,
            paths: svg.querySelectorAll('[id^="data-"] path, [id^="data-"] use').length});
});
const pre = document.createElement('pre'); pre.id = 'dflash-check';
pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
</script></body>"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    raise AssertionError(
        "no Chromium: install it (scripts/setup.sh does: apt-get install chromium)"
    )


def browse(page: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--hide-scrollbars",
            "--user-data-dir=" + str(page.parent / ".chromium"),
            *flags,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def console_errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]


def test_report_renders_in_chromium_with_data_in_every_plot(followed, tmp_path):
    out = tmp_path / "report.html"
    proc = dflash("results", "report", "-o", str(out), "-i", str(followed.inventory), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    # Self-contained: nothing is fetched (links are only SVG/RDF namespace names).
    assert not re.search(r"""<(script|link|img|iframe)\b|\bsrc=|url\((?!#)""", page)
    for run_id in followed.run_ids():
        assert run_id in page
    assert "Δ tau vs" in page and "95% interval" in page and "drafter sha256" in page

    # The console check can fail: a page with a deliberate error is caught.
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('boom')</script></body></html>")
    assert console_errors(browse(bad, "--dump-dom").stderr)

    shot = tmp_path / "report.png"
    proc = browse(out, "--window-size=1200,2600", f"--screenshot={shot}")
    assert proc.returncode == 0, proc.stderr
    assert console_errors(proc.stderr) == []
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 30_000
    Path(os.environ.get("DFLASH_REPORT_SHOT", tmp_path / "keep.png")).write_bytes(shot.read_bytes())

    checked = tmp_path / "checked.html"
    checked.write_text(page.replace("</body>", CHECK_SCRIPT))
    proc = browse(checked, "--dump-dom")
    assert console_errors(proc.stderr) == []
    found = re.search(r'<pre id="dflash-check">(.*?)</pre>', proc.stdout, re.S)
    assert found, proc.stdout[-2000:]
    plots = json.loads(found.group(1).replace("&quot;", '"'))
    names = [p["plot"] for p in plots]
    assert names[0] == "tau" and names.count("tau") == 1
    for name in ("acceptance_histogram", "per_position_acceptance", "tau_by_context"):
        assert sum(bool(re.fullmatch(rf"{name}\d+", n)) for n in names) == 3, names
    assert sum(n.startswith("per_position_acceptance_by_context") for n in names) == 3
    for p in plots:
        assert p["width"] > 200, p
        assert p["data"] > 0 and p["drawn"] == p["data"], p
    tau = plots[0]
    assert tau["data"] == 2 + 2  # tau, token-weighted, DDTree-2, DDTree-4


# ---- the results CLI -------------------------------------------------------------------


def test_list_and_show_full_ids_prefixes_times_and_100_columns(followed):
    inv = str(followed.inventory)
    proc = dflash("results", "list", "-i", inv, cwd="/")
    assert proc.returncode == 0, proc.stderr
    for run_id in followed.run_ids():
        assert run_id in proc.stdout  # never cut
    assert max(len(line) for line in proc.stdout.splitlines()) <= 100
    run_id = followed.run_ids()[1]
    show = dflash("results", "show", run_id[:-3], "-i", inv, cwd="/")
    assert show.returncode == 0, show.stderr
    assert run_id in show.stdout
    assert re.search(r"evaluated\s+│ \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", show.stdout)
    assert not re.search(r"\b1[0-9]{9}\.\d+", show.stdout)  # no raw epoch seconds
    assert max(len(line) for line in show.stdout.splitlines()) <= 100
    ambiguous = dflash("results", "show", run_id[:9], "-i", inv, cwd="/")
    assert ambiguous.returncode != 0
    lines = [ln for ln in ambiguous.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "matches 3 runs" in lines[0]


def test_an_unknown_dtype_is_one_clear_line(followed):
    proc = dflash(
        "remote-eval",
        "--checkpoint",
        "x",
        "--dtype",
        "fp16",
        "-i",
        str(followed.inventory),
        cwd="/",
    )
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == [
        "error: dtype 'fp16' is not supported; use bfloat16 (bf16) or float32 (fp32)"
    ], proc.stderr
