"""The relay's planner and selection on hand-built scans: pure, no hosts, no sshd.

Each case is what a destination's scan says against a source checkpoint; the plan must
send exactly what is missing, resume where both hosts agree on a prefix, resend what is
damaged, and skip (with its reason) what was asked for but is not finished.
"""

from __future__ import annotations

import pytest

from orchestrator.relay.checkpoints import Checkpoint, Scan, SourceFile
from orchestrator.relay.options import RelayOptions
from orchestrator.relay.plan import Dest, check_space, decide, draft
from orchestrator.relay.report import RelayError
from orchestrator.relay.selection import select
from remote.protocol import MANIFEST_FORMAT, PARTIAL_PREFIX, REPAIR_PREFIX

SRC = "/train/ckpts"
ROOT = "/eval/drafters"


def ckpt(name: str = "step_100", *, complete: bool = True, reason: str = "") -> Checkpoint:
    files = [SourceFile("model.safetensors", 1000, 10.0), SourceFile("config.json", 50, 11.0)]
    step = int(name.rsplit("_", 1)[-1])
    return Checkpoint(name, "dir", files, step=step, complete=complete, reason=reason)


def manifest_of(c: Checkpoint) -> dict:
    return {
        "format": MANIFEST_FORMAT,
        "files": [
            {"path": f.path, "size": f.size, "mtime": f.mtime, "sha256": f"sha-{f.path}"}
            for f in c.files
        ],
    }


def dest_scan(**kw) -> Scan:
    return Scan(root=ROOT, now=100.0, exists=True, free=10**9, **kw)


def plan_for(c: Checkpoint, scan: Scan, *, verify=False, dst=None):
    d = Dest("eval", ROOT, scan)
    dr = draft([c], [d], verify=verify)
    return dr, decide(dr, SRC, {"eval": dst or {}})


def test_unchanged_published_checkpoint_needs_no_task_and_no_hash():
    c = ckpt()
    scan = dest_scan(checkpoints={c.name: ckpt()}, manifests={c.name: manifest_of(c)})
    dr, p = plan_for(c, scan)
    assert dr.dest_requests == {"eval": ()}
    (cp,) = p.checkpoints
    assert cp.tasks == ()
    st = cp.report.destinations["eval"]
    assert (st.status, st.bytes_skipped, st.bytes_planned) == ("unchanged", c.size, 0)
    assert p.need == {"eval": 0}


def test_absent_checkpoint_is_sent_whole_into_the_partial_folder():
    c = ckpt()
    _, p = plan_for(c, dest_scan())
    (cp,) = p.checkpoints
    assert [t.file.path for t in cp.tasks] == ["model.safetensors", "config.json"]
    (t,) = cp.tasks[0].targets
    assert t.write_path == f"{ROOT}/{PARTIAL_PREFIX}{c.name}/model.safetensors"
    assert t.offset == 0 and t.rename_to is None
    assert cp.tasks[0].src_path == f"{SRC}/{c.name}/model.safetensors"
    assert cp.report.destinations["eval"].status == "planned"
    assert p.need == {"eval": c.size} and p.total_bytes == c.size


def test_partial_file_resumes_at_its_length_with_no_hash_before_the_stream():
    """The kept prefix is proved by the whole file's hash on both hosts during the
    transfer (a mismatch is sent again from 0 there), so planning asks for no hash."""
    c = ckpt()
    scan = dest_scan(partials={c.name: [SourceFile("model.safetensors", 400, 9.0)]})
    dr, p = plan_for(c, scan)
    assert dr.dest_requests == {"eval": ()}
    task = p.checkpoints[0].tasks[0]
    assert task.targets[0].offset == 400 and task.to_send == 600
    st = p.checkpoints[0].report.destinations["eval"]
    assert st.bytes_skipped == 400 and st.bytes_planned == 600 + 50


@pytest.mark.parametrize("verify", [False, True])
def test_partial_file_resumes_where_its_host_saved_a_hash_state(verify):
    """A scan that reports a saved state (``resume``) inside the partial file moves the
    offset back to it and asks the destination to continue from that state; --verify
    ignores saved states (the kept prefix is hashed again, from its length)."""
    from remote.relay.sha256state import GRID

    c = Checkpoint("step_7", "dir", [SourceFile("model.safetensors", 3 * GRID, 10.0)], 7)
    part = SourceFile("model.safetensors", 2 * GRID + 5, 9.0, resume=2 * GRID)
    _, p = plan_for(c, dest_scan(partials={c.name: [part]}), verify=verify)
    (t,) = p.checkpoints[0].tasks[0].targets
    assert (t.offset, t.saved_state) == ((2 * GRID + 5, False) if verify else (2 * GRID, True))
    assert p.checkpoints[0].report.destinations["eval"].bytes_skipped == t.offset


def test_a_scan_whose_resume_offset_is_off_the_grid_or_past_the_file_is_refused():
    from orchestrator.relay.checkpoints import ScanRefused, parse_scan
    from remote.relay.sha256state import GRID

    def scan_with(resume) -> dict:
        entry = {"path": "w.bin", "size": 2 * GRID, "mtime": 1.0, "resume": resume}
        return {
            "now": 1.0,
            "exists": True,
            "free": 10,
            "entries": [],
            "manifests": {},
            "partials": {"step_1": [entry]},
        }

    assert parse_scan(ROOT, scan_with(GRID), "eval").partials["step_1"][0].resume == GRID
    for bad in (GRID + 1, 3 * GRID, -GRID, "32", True, 1.5):
        with pytest.raises(ScanRefused, match="resume offset of .*w.bin"):
            parse_scan(ROOT, scan_with(bad), "eval")


def test_partial_file_at_full_size_is_checked_by_an_empty_stream():
    c = ckpt()
    scan = dest_scan(partials={c.name: [SourceFile("model.safetensors", 1000, 9.0)]})
    _, p = plan_for(c, scan)
    model, config = p.checkpoints[0].tasks
    assert model.file.path == "model.safetensors" and model.to_send == 0
    assert model.targets[0].offset == 1000 and config.to_send == 50
    # A partial file longer than its source is not a prefix of it: sent from 0.
    scan = dest_scan(partials={c.name: [SourceFile("model.safetensors", 1001, 9.0)]})
    _, p = plan_for(c, scan)
    assert p.checkpoints[0].tasks[0].targets[0].offset == 0


def test_partial_files_the_source_lacks_are_stale():
    c = ckpt()
    scan = dest_scan(partials={c.name: [SourceFile("optimizer.pt", 7, 1.0)]})
    _, p = plan_for(c, scan)
    assert p.stale == {"eval": (f"{ROOT}/{PARTIAL_PREFIX}{c.name}/optimizer.pt",)}


def test_damaged_published_file_is_resent_beside_it_and_renamed_over_it():
    c = ckpt()
    there = ckpt()
    there.files[0] = SourceFile("model.safetensors", 999, 10.0)  # truncated since
    scan = dest_scan(checkpoints={c.name: there}, manifests={c.name: manifest_of(c)})
    _, p = plan_for(c, scan)
    (cp,) = p.checkpoints
    (task,) = cp.tasks
    (t,) = task.targets
    final = f"{ROOT}/{c.name}/model.safetensors"
    assert (
        t.rename_to == final and t.write_path == f"{ROOT}/{c.name}/{REPAIR_PREFIX}model.safetensors"
    )
    st = cp.report.destinations["eval"]
    assert st.repaired == ["model.safetensors"] and st.bytes_skipped == c.size - 1000


def test_verify_resends_only_the_file_whose_hash_differs_from_the_manifest():
    c = ckpt()
    scan = dest_scan(checkpoints={c.name: ckpt()}, manifests={c.name: manifest_of(c)})
    dr, _ = plan_for(c, scan, verify=True)
    keys = [(r["path"], None) for r in dr.dest_requests["eval"]]
    assert len(keys) == 2
    answers = {keys[0]: {"sha256": "flipped"}, keys[1]: {"sha256": "sha-config.json"}}
    p = decide(dr, SRC, {"eval": answers})
    assert [t.file.path for t in p.checkpoints[0].tasks] == ["model.safetensors"]


def test_published_folder_without_manifest_is_refused():
    c = ckpt()
    with pytest.raises(RelayError, match="not relayed by dflash"):
        draft([c], [Dest("eval", ROOT, dest_scan(checkpoints={c.name: ckpt()}))])


def test_plan_larger_than_free_space_minus_reserve_is_refused_with_the_numbers():
    c = ckpt()
    d = Dest("eval", ROOT, Scan(ROOT, 0.0, True, free=2000), reserve=1500)
    p = decide(draft([c], [d]), SRC)
    with pytest.raises(RelayError, match="not enough space.*short by"):
        check_space(p, [d])


def test_named_incomplete_checkpoint_is_skipped_with_its_reason():
    src = dest_scan(
        checkpoints={
            "step_100": ckpt("step_100"),
            "step_200": ckpt("step_200", complete=False, reason="no COMPLETE marker yet"),
        }
    )
    chosen = select(src, "trainer:/t", RelayOptions(names=["step_200", "step_100"]))
    assert [c.name for c in chosen.checkpoints] == ["step_100"]
    assert chosen.skipped == (
        {"name": "step_200", "step": 200, "reason": "no COMPLETE marker yet", "named": True},
    )
    # The default (newest complete) skips nothing and takes step_100.
    latest = select(src, "trainer:/t", RelayOptions())
    assert [c.name for c in latest.checkpoints] == ["step_100"] and latest.skipped == ()


def test_named_checkpoint_the_source_lacks_is_refused_listing_what_it_has():
    src = dest_scan(checkpoints={"step_100": ckpt("step_100")})
    with pytest.raises(
        RelayError, match=r"no checkpoint 'step_9' in trainer:/t \(have: step_100\)"
    ):
        select(src, "trainer:/t", RelayOptions(names=["step_9"]))
