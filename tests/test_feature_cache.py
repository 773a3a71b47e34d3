"""The eval host's target-feature cache (`remote.eval.feature_cache`): a second eval reads
the target's features back and gives the same rounds, sample by sample; an entry is used
only when its key and bytes match; the folder stays inside its bound, least recently used
first; two evals writing at once leave only whole entries; the setting travels from the
inventory and the command line to the host, checked by the contract."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import torch

from orchestrator.inventory import InventoryError, parse_inventory
from remote.eval import feature_cache
from remote.eval.engine import run_eval
from remote.eval.feature_cache import COSTS_SUFFIX, SUFFIX, TMP_PREFIX, FeatureCache, RunCache
from remote.protocol import (
    FEATURE_CACHE_DEFAULT_GIB,
    TARGET_COSTS,
    EvalSpec,
    JobSpec,
    SpecError,
)
from tests.helpers import evalkit
from tests.helpers.cli import dflash
from tests.helpers.sshd import ssh_host_entry

WIDTH = 12
CONTEXT = {"v": 1, "target": {"path": "/t", "config_sha256": "c"}, "layer_ids": [1, 2]}


def sample(n: int, prompt: int = 5, completion: int = 7) -> tuple[list[int], list[int]]:
    return [n] * prompt, list(range(n, n + completion))


def tensors(n: int, prompt: int = 5, completion: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    T = prompt + completion
    feats = torch.randn(T, WIDTH, generator=g).to(torch.bfloat16)
    return feats, torch.randint(0, 100, (T - prompt + 1,), generator=g)


def run_cache(root: Path, limit: int = 2**30, context: dict = CONTEXT) -> RunCache:
    cache = FeatureCache(root, limit).open(context, WIDTH)
    assert isinstance(cache, RunCache), cache
    return cache


def comparable(record: dict) -> dict:
    """A sample record without its timings (the only part a cache may change)."""
    return {k: v for k, v in record.items() if k != "seconds"}


@pytest.fixture(scope="module")
def kit_gt(tmp_path_factory):
    """The evalkit's tiny Qwen3 target, two checkpoints of its drafter's training, and a
    ground-truth file of six of its greedy samples."""
    kit = evalkit.kit("qwen3")
    gt = tmp_path_factory.mktemp("gt") / "gt.jsonl"
    lines = [
        {"id": f"s{i}", "prompt_ids": r["prompt_ids"], "completion_ids": r["completion_ids"]}
        for i, r in enumerate(kit.rows[:6])
    ]
    gt.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return kit, gt


def evaluate(kit, gt: Path, drafter: str, out: Path, features) -> tuple[dict, list[dict]]:
    spec = EvalSpec(
        target=kit.target,
        drafter=drafter,
        ground_truth=str(gt),
        output_dir=str(out),
        dtype="bfloat16",
        budgets=(4, 8),
        positions="walk",
    )
    result = run_eval(spec, on_event=lambda ev: None, features=features)
    lines = (out / "samples.jsonl").read_text().splitlines()
    return result, [json.loads(line) for line in lines]


@pytest.mark.slow
def test_a_second_eval_from_the_cache_gives_the_same_rounds(kit_gt, tmp_path, monkeypatch):
    """Checkpoint A twice and checkpoint B once with the cache, each against the eval
    without it: the same records sample by sample (rounds, DDTree rounds, per-position
    counts, agreement) and the same metrics; the first eval computes and keeps every
    sample's features, the next two read them all back, and each result says so."""
    import remote.eval.walk as walk

    monkeypatch.setattr(walk, "LOCKSTEP_SAMPLES", 4)  # several lockstep batches
    kit, gt = kit_gt
    a, b = kit.steps[0], kit.steps[-1]
    cache = FeatureCache(tmp_path / "features", 2**30)
    ref = {d: evaluate(kit, gt, d, tmp_path / f"ref-{i}", None) for i, d in enumerate((a, b))}
    runs = [
        (a, evaluate(kit, gt, a, tmp_path / "a-cold", cache)),
        (a, evaluate(kit, gt, a, tmp_path / "a-warm", cache)),
        (b, evaluate(kit, gt, b, tmp_path / "b-warm", cache)),
    ]
    for drafter, (result, records) in runs:
        want_result, want_records = ref[drafter]
        assert [comparable(r) for r in records] == [comparable(r) for r in want_records]
        assert result["metrics"] == want_result["metrics"]
    off = {"cached": False, "cache": "off", "target_loaded": "whole"}
    assert ref[a][0]["inputs"]["target_features"] == off
    cold, warm, other = (r[1][0]["inputs"]["target_features"] for r in runs)
    assert (cold["cached"], cold["samples_cached"], cold["samples_stored"]) == (False, 0, 6)
    assert cold["target_loaded"] == "whole"
    for got in (warm, other):
        assert (got["cached"], got["samples_cached"], got["samples_stored"]) == (True, 6, 0)
        assert got["target_loaded"] == "embedding_and_head"
    assert cold["cache_key"] == warm["cache_key"] == other["cache_key"]
    assert len(list((tmp_path / "features").glob("*" + SUFFIX))) == 6
    # The target's round costs: measured once, read back by the warm evals; the drafter's
    # timed in each.
    cold_costs, warm_costs, other_costs = (r[1][0]["timings"]["round_costs"] for r in runs)
    assert (cold_costs["target_costs"], warm_costs["target_costs"]) == ("measured", "cached")

    def target_only(costs: dict) -> dict:  # the drafter's trials are each run's own
        part = {k: costs[k] for k in TARGET_COSTS if k in costs}
        spread = part.get("spread", {})
        return {**part, "spread": {k: v for k, v in spread.items() if k != "drafter_round_s"}}

    target_part = target_only(cold_costs)
    assert set(target_part) >= {"target_step_s", "target_verify_s", "tree_verify_s"}
    for got in (warm_costs, other_costs):
        assert target_only(got) == target_part
        assert got["drafter_round_s"] > 0
    assert len(list((tmp_path / "features").glob("*" + COSTS_SUFFIX))) == 1


def test_an_entry_torn_after_the_eval_began_loads_the_target_s_layers(kit_gt, tmp_path):
    """The entries' headers say every sample is cached, so the eval loads the target's
    embedding and head alone; one entry's tensors are torn: that sample's features are
    computed after all (the layers loaded then, one warning), and the rounds are the
    eval's without the cache."""
    kit, gt = kit_gt
    cache = FeatureCache(tmp_path / "features", 2**30)
    ref, want = evaluate(kit, gt, kit.steps[0], tmp_path / "ref", None)
    evaluate(kit, gt, kit.steps[0], tmp_path / "cold", cache)
    entry = sorted((tmp_path / "features").glob("*" + SUFFIX))[2]
    data = bytearray(entry.read_bytes())
    data[-4:] = b"\x00\xff\x00\xff"  # the tensors' last bytes: the header is intact
    entry.write_bytes(bytes(data))
    events: list[dict] = []
    spec = EvalSpec(
        target=kit.target,
        drafter=kit.steps[0],
        ground_truth=str(gt),
        output_dir=str(tmp_path / "torn"),
        dtype="bfloat16",
        budgets=(4, 8),
        positions="walk",
    )
    result = run_eval(spec, on_event=events.append, features=cache)
    lines = (tmp_path / "torn" / "samples.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines]
    assert [comparable(r) for r in records] == [comparable(r) for r in want]
    assert result["metrics"] == ref["metrics"]
    start = next(e for e in events if e["event"] == "start")
    assert start["target_loaded"] == "embedding_and_head"
    got = result["inputs"]["target_features"]
    assert (got["samples_cached"], got["samples_stored"], got["target_loaded"]) == (5, 1, "whole")
    warnings = [e["message"] for e in events if e["event"] == "warning"]
    assert len(warnings) == 1 and "failed its check" in warnings[0], warnings


def test_an_entry_is_used_only_when_its_key_and_bytes_match(tmp_path):
    """A kept sample reads back equal; another sample, another context or dtype, a file
    renamed to another sample's name, a flipped byte, a torn file and a symlink each read
    as a miss, never as data."""
    root = tmp_path / "features"
    cache = run_cache(root)
    for n in range(6):
        cache.store(*sample(n), *tensors(n))
    assert cache.stored == 6
    feats, greedy = cache.lookup(*sample(0), torch.bfloat16)
    want = tensors(0)
    assert torch.equal(feats, want[0]) and torch.equal(greedy, want[1])
    assert cache.lookup(*sample(9), torch.bfloat16) is None
    assert cache.lookup(*sample(0), torch.float32) is None
    other = run_cache(root, context={**CONTEXT, "layer_ids": [1, 3]})
    assert other.lookup(*sample(0), torch.bfloat16) is None
    # a whole entry, but another sample's, under this one's name
    name = {n: cache.name(cache.entry_meta(*sample(n))) for n in range(6)}
    os.replace(root / name[2], root / name[1])
    # a byte of the features flipped (its header still whole)
    data = bytearray((root / name[3]).read_bytes())
    data[-20] ^= 0xFF
    (root / name[3]).write_bytes(bytes(data))
    # torn mid-write (what a rename never shows, but a disk may)
    (root / name[4]).write_bytes((root / name[5]).read_bytes()[:100])
    # a symlink planted in the folder, to a whole entry elsewhere
    elsewhere = tmp_path / "elsewhere"
    os.replace(root / name[5], elsewhere)
    (root / name[5]).symlink_to(elsewhere)
    for n in (1, 3, 4, 5):
        assert cache.lookup(*sample(n), torch.bfloat16) is None, n
    # stored again, each is whole: the symlink replaced, not followed
    for n in (1, 3, 4, 5):
        cache.store(*sample(n), *tensors(n))
        got = cache.lookup(*sample(n), torch.bfloat16)
        assert got is not None and torch.equal(got[0], tensors(n)[0])
    assert not (root / name[5]).is_symlink() and elsewhere.is_file()


_GROWN_ENTRY = """
import json, resource, sys, torch
from remote.eval.feature_cache import FeatureCache
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
root, context, width, prompt, completion = json.loads(sys.argv[1])
cache = FeatureCache(root, 2**30).open(context, width)
print(cache.lookup(prompt, completion, torch.bfloat16))
"""


def test_an_entry_grown_past_what_its_key_allows_is_a_miss_never_read_whole(tmp_path):
    """The fault run's case: an entry grown to 20 GiB was read whole (the runner
    OOM-killed). Its key fixes its size: a larger file is no entry, and is not read."""
    import subprocess
    import sys

    from tests.helpers.cli import ROOT

    root = tmp_path / "features"
    cache = run_cache(root)
    cache.store(*sample(0), *tensors(0))
    entry = root / cache.name(cache.entry_meta(*sample(0)))
    size = entry.stat().st_size
    with open(entry, "r+b") as fh:
        fh.truncate(8 << 30)  # sparse: 8 GiB the reader must not take, in a 2 GiB process
    proc = subprocess.run(
        [sys.executable, "-c", _GROWN_ENTRY, json.dumps([str(root), CONTEXT, WIDTH, *sample(0)])],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "None", proc.stderr[-2000:]
    with open(entry, "r+b") as fh:  # back to its own size: whole again, and read
        fh.truncate(size)
    assert cache.lookup(*sample(0), torch.bfloat16) is not None


def test_the_target_s_costs_are_read_back_only_whole_and_for_their_own_key(tmp_path):
    """A costs entry is used for the same context and inputs only, and only when every
    figure is a positive number; a file edited to say otherwise is a miss."""
    costs = {
        "context_tokens": 40,
        "target_step_s": 0.01,
        "target_verify_s": {"16": 0.02},
        "tree_verify_s": {"8": 0.015},
        "repeats": 5,
    }
    inputs = {"ids_sha256": "a" * 64, "tokens": 56, "sizes": [16, 9], "budgets": [8]}
    cache = run_cache(tmp_path)
    assert cache.lookup_costs(inputs) is None
    cache.store_costs(inputs, costs)
    assert cache.lookup_costs(inputs) == costs
    assert cache.lookup_costs({**inputs, "budgets": [16]}) is None
    other = run_cache(tmp_path, context={**CONTEXT, "layer_ids": [1, 3]})
    assert other.lookup_costs(inputs) is None
    entry = tmp_path / cache.costs_name(inputs)
    doc = json.loads(entry.read_text())
    for bad in ({"target_step_s": -1.0}, {"target_verify_s": {}}, {"tree_verify_s": {"x": 1}}):
        entry.write_text(json.dumps({**doc, "costs": {**costs, **bad}}))
        assert cache.lookup_costs(inputs) is None, bad
    entry.write_text(json.dumps(doc)[:-9])
    assert cache.lookup_costs(inputs) is None


def test_the_folder_stays_in_its_bound_least_recently_used_first(tmp_path):
    """Bounded at three entries: a run keeps the first three of five (never evicting its
    own); the next run's hit makes that entry the most recent, and the two it stores
    evict the two least recently used others."""
    root = tmp_path / "features"
    probe = run_cache(tmp_path / "probe")
    probe.store(*sample(0), *tensors(0))
    size = next(iter(probe.entries()))[1]
    first = run_cache(root, limit=3 * size)
    for n in range(5):
        first.store(*sample(n), *tensors(n))
    assert (first.stored, first.not_stored) == (3, 2)
    names = {n: first.name(first.entry_meta(*sample(n))) for n in range(5)}
    assert sorted(p.name for p in root.glob("*" + SUFFIX)) == sorted(names[n] for n in range(3))
    for age, n in enumerate((0, 1, 2)):  # oldest first: 0, 1, 2
        os.utime(root / names[n], ns=(10**18 + age * 10**9,) * 2)
    second = run_cache(root, limit=3 * size)
    assert second.lookup(*sample(0), torch.bfloat16) is not None
    second.store(*sample(3), *tensors(3))
    second.store(*sample(4), *tensors(4))
    kept = sorted(p.name for p in root.glob("*" + SUFFIX))
    assert kept == sorted(names[n] for n in (0, 3, 4))
    assert sum(p.stat().st_size for p in root.glob("*" + SUFFIX)) <= 3 * size


def test_two_evals_writing_at_once_leave_only_whole_entries(tmp_path):
    """Two runs storing the same samples at the same time: every entry reads back whole
    and equal, and no temp file is left."""
    root = tmp_path / "features"
    caches = [run_cache(root), run_cache(root)]

    def write(cache: RunCache) -> None:
        for n in range(12):
            cache.store(*sample(n), *tensors(n))

    threads = [threading.Thread(target=write, args=(c,)) for c in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [c.stored for c in caches] == [12, 12]
    reader = run_cache(root)
    for n in range(12):
        got = reader.lookup(*sample(n), torch.bfloat16)
        assert got is not None and torch.equal(got[0], tensors(n)[0]), n
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == [".lock"]


def test_a_full_disk_keeps_nothing_half_written_and_says_so_once(tmp_path, monkeypatch):
    """On a real filesystem with no byte left, every store fails in the write: counted as
    not stored, one warning line for the run (the eval goes on), no entry and no temp file
    left. A disk with room but under the reserve is left alone without a write; with room
    again and no reserve asked, the same sample is kept whole."""
    from tests.helpers.diskfull import fill, tiny_filesystem

    with tiny_filesystem(tmp_path / "tiny", "1m") as disk:
        cache = run_cache(disk / "features")
        long = {"completion": 4000}  # 96 KiB of features a sample
        filler = fill(disk)
        for n in range(3):
            cache.store(*sample(n, **long), *tensors(n, **long))
        assert (cache.stored, cache.not_stored) == (0, 3)
        [warning] = cache.warnings
        assert warning.startswith(f"the feature cache {disk / 'features'} could not keep ")
        assert "(no space left on device); the eval goes on without it" in warning
        left = [p.name for p in (disk / "features").iterdir()]
        assert not [n for n in left if n.startswith(TMP_PREFIX) or n.endswith(SUFFIX)], left
        assert cache.lookup(*sample(0, **long), torch.bfloat16) is None
        filler.unlink()
        cache.store(*sample(0, **long), *tensors(0, **long))  # 1 MiB free, under the reserve
        assert (cache.stored, cache.not_stored, len(cache.warnings)) == (0, 4, 1)
        assert not list((disk / "features").glob("*" + SUFFIX))
        monkeypatch.setattr(feature_cache, "RESERVE_BYTES", 0)
        cache.store(*sample(0, **long), *tensors(0, **long))
        got = cache.lookup(*sample(0, **long), torch.bfloat16)
        assert cache.stored == 1 and got is not None
        assert torch.equal(got[0], tensors(0, **long)[0])
        cache.close()


def test_a_symlinked_cache_folder_is_not_used(tmp_path):
    """A cache folder that is a symlink is refused in one warning line; nothing is written
    through it."""
    (tmp_path / "real").mkdir()
    (tmp_path / "features").symlink_to(tmp_path / "real")
    got = FeatureCache(tmp_path / "features", 2**30).open(CONTEXT, WIDTH)
    assert isinstance(got, str) and "symlink" in got and "\n" not in got
    assert list((tmp_path / "real").iterdir()) == []


def test_a_sharded_run_says_its_features_were_cached_only_when_every_shard_s_were():
    """The merged result of a sharded eval sums its shards' counts; one shard that computed
    its features makes the run's not cached, whatever the first shard says."""
    from orchestrator.eval.shards.plan import merge_result

    def shard(cached: bool, hits: int, stored: int) -> dict:
        feats = {"cached": cached, "cache": "on", "samples_cached": hits, "samples_stored": stored}
        inputs = {"block_size": 4, "target_vocab_size": 32, "target_features": feats}
        return {"inputs": inputs, "timings": {}}

    def merged(*shards: dict) -> dict:
        got = merge_result(list(shards), [], ground_truth_source={}, shards={}, job={}, wall_s=1)
        return got["inputs"]["target_features"]

    assert merged(shard(True, 3, 0), shard(False, 0, 2)) == {
        "cached": False,
        "cache": "on",
        "samples_cached": 3,
        "samples_stored": 2,
    }
    assert merged(shard(True, 3, 0), shard(True, 2, 0))["cached"] is True


def test_the_setting_is_checked_once_by_the_contract(tmp_path):
    """``feature_cache_gib`` in the eval role and in a job: the contract's one check on
    both sides; 0 or absent is the default bound; ``feature_cache: false`` turns it off."""
    assert JobSpec.from_json({}).feature_cache_bytes() == FEATURE_CACHE_DEFAULT_GIB * 2**30
    assert JobSpec.from_json({"feature_cache_gib": 0}).feature_cache_bytes() == (
        FEATURE_CACHE_DEFAULT_GIB * 2**30
    )
    assert JobSpec.from_json({"feature_cache_gib": 0.5}).feature_cache_bytes() == 2**29
    off = JobSpec.from_json({"feature_cache": False, "feature_cache_gib": 4})
    assert off.feature_cache_bytes() == 0
    assert FeatureCache.for_job(str(tmp_path), off.feature_cache_bytes()) is None
    for bad in (-1, "10G", float("nan"), True):
        with pytest.raises(SpecError, match="feature_cache_gib"):
            JobSpec.from_json({"feature_cache_gib": bad})
    with pytest.raises(SpecError, match="feature cache switch"):
        JobSpec.from_json({"feature_cache": "no"})
    head = "hosts:\n  h:\n    roles:\n      eval: {drafters: /d, feature_cache_gib: %s}\n"
    inv = parse_inventory(head % "2.5", Path("inv.yaml"))
    assert inv.hosts["h"].eval.feature_cache_gib == 2.5
    with pytest.raises(InventoryError) as err:
        parse_inventory(head % "-3", Path("inv.yaml"))
    assert str(err.value).startswith("inv.yaml:4: hosts.h.roles.eval.feature_cache_gib")
    assert "number of GiB" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_remote_eval_reads_features_another_checkpoint_kept(
    eval_sshd, ssh_base, make_inventory, tiny_target, gt_server, server, tmp_path
):
    """Over a loopback sshd: a checkpoint's eval keeps its features in the host's workdir
    (bounded by the role's ``feature_cache_gib``); the next checkpoint's reads them all
    back; ``--no-feature-cache`` computes them afresh, with the same rounds. The run's
    summary and ``results show`` say where the features came from."""
    from orchestrator.demo.train import train_drafter

    drafters = eval_sshd.root / "fc-drafters"
    train_drafter(str(tiny_target), str(drafters), save_steps=(0, 12), samples=6, batch_samples=3)
    workdir = eval_sshd.root / "fc-dflash"
    role = {
        "drafters": str(drafters),
        "target_model": str(tiny_target),
        "ground_truth": gt_server.url,
        "ground_truth_kind": "sglang",
        "dtype": "float32",
        "feature_cache_gib": 1,
    }
    inv = make_inventory(
        hosts={
            "evalhost": ssh_host_entry(
                eval_sshd, ssh_base, roles={"eval": role}, workdir=str(workdir)
            )
        },
        defaults={"eval_host": "evalhost", "results_dir": str(tmp_path / "results")},
    )

    def remote_eval(checkpoint: str, *more: str) -> tuple[dict, list[dict], dict]:
        got = dflash(
            "remote-eval", "-c", checkpoint, "--samples", "3", "--max-new-tokens", "16",
            "--budgets", "4", "-i", str(inv), "--json", *more, timeout=300,
        )  # fmt: skip
        assert got.returncode == 0, got.stderr
        out = json.loads(got.stdout)
        run_dir = Path(out["run_dir"])
        result = json.loads((run_dir / "result.json").read_text())
        lines = (run_dir / "samples.jsonl").read_text().splitlines()
        features = result["inputs"]["target_features"]
        return features, [comparable(json.loads(x)) for x in lines], out["summary"]

    first, _, summary = remote_eval("step-0")
    assert (first["cached"], first["samples_stored"]) == (False, 3)
    assert summary["features_cached"] is False
    assert len(list((workdir / "features").glob("*" + SUFFIX))) == 3
    second, cached_records, summary = remote_eval("step-12")
    assert (second["cached"], second["samples_cached"]) == (True, 3)
    assert summary["features_cached"] is True
    show = dflash("results", "show", summary["run_id"], "-i", str(inv))
    row = next(line for line in show.stdout.splitlines() if "target features" in line)
    assert "cached on host" in row and "layers not loaded" in row
    assert second["target_loaded"] == "embedding_and_head"  # the ground truth cached too
    fresh, fresh_records, summary = remote_eval("step-12", "--no-feature-cache")
    assert fresh == {"cached": False, "cache": "off", "target_loaded": "whole"}
    assert summary["features_cached"] is False
    assert cached_records == fresh_records
