"""`probe` over tiny real checkpoints: structure, key mapping, drafter checks, --load, errors.

Checkpoints are built once per session (`orchestrator.demo.architectures`) and saved as real
safetensors
with `save_pretrained`. The remote command runs as a user would run it (``python -m remote
probe``) and through the library; the controller side runs over a local host and over a real
loopback sshd host.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.demo.architectures import ARCHITECTURES, Dims, save_tiny
from remote.errors import EXIT_USER_ERROR, UserError
from remote.probe.structure import SCHEMA, default_target_layer_ids, probe
from tests.helpers.architectures import LAYERS_PATH, VLM
from tests.helpers.cli import ROOT, dflash
from tests.helpers.cli import one_error_line as cli_error_line
from tests.helpers.drafters import build_drafter
from tests.helpers.sshd import ssh_host_entry

HIDDEN, VOCAB = Dims().hidden, Dims().vocab
# Probed with --load once per session: dense, hybrid linear-attention, MoE and VLM layouts.
PROBED = [
    "qwen3",
    "llama",
    "qwen3_5",
    "qwen3_next",
    "qwen3_vl",
    "qwen2_5_vl",
    "llava",
    "gemma3",
    "mistral3",
]


@pytest.fixture(scope="session")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("tiny")
    return {name: save_tiny(name, base / name) for name in PROBED}


@pytest.fixture(scope="session")
def loaded_reports(ckpts) -> dict[str, dict]:
    return {name: probe(str(path), load=True) for name, path in ckpts.items()}


def remote_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "remote", "probe", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("dflash-remote: error:")]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert proc.returncode == EXIT_USER_ERROR
    assert proc.stdout == ""
    return lines[0]


# ---- structure and --load over every architecture ----------------------------------------


@pytest.mark.parametrize("name", PROBED)
def test_structure_and_hidden_states(name, loaded_reports):
    r = loaded_reports[name]
    layers_path, count, is_vlm = LAYERS_PATH[name], ARCHITECTURES[name].layers, name in VLM
    assert r["schema"] == SCHEMA
    assert r["text"]["layers"] == layers_path
    assert r["text"]["num_layers"] == count == r["text"]["config_num_hidden_layers"]
    assert r["text"]["hidden_size"] == HIDDEN
    assert r["text"]["vocab_size"] == VOCAB
    assert r["is_vlm"] is is_vlm
    assert r["text"]["embed_tokens"].rsplit(".", 1)[0] == layers_path.rsplit(".", 1)[0]
    assert r["keys"]["complete"], (r["keys"]["missing"], r["keys"]["unexpected"])
    assert r["checkpoint"]["shards_complete"]
    assert (r["parameters"]["vision"]["params"] > 0) is is_vlm
    assert r["parameters"]["total"]["params"] == sum(
        r["parameters"][k]["params"] for k in ("text", "vision", "other")
    )
    load = r["load"]
    assert load["ok"], load
    assert load["hidden_states"] == count + 1
    assert load["layer_outputs_match"] and load["mismatched_layers"] == []
    # transformers 5.x: the last entry is the final-normed output, reported not failed.
    assert load["last_hidden_state"] == "final_normed"
    assert load["embedding_is_hidden_states_0"]


def test_vlm_text_load_never_builds_the_vision_tower(loaded_reports):
    r = loaded_reports["qwen3_5"]
    assert r["load"]["backbone_class"] == "Qwen3_5TextModel"
    assert r["parameters"]["vision"]["modules"] == ["model.visual"]
    assert r["host"]["text_only_bytes_needed"] == r["parameters"]["text"]["bytes"]
    assert r["host"]["text_only_bytes_needed"] < r["parameters"]["total"]["bytes"]


def test_hybrid_layer_kinds_grouped(loaded_reports):
    for name in ("qwen3_5", "qwen3_next"):
        t = loaded_reports[name]["text"]
        assert t["layer_types_config"] == {"linear_attention": 3, "full_attention": 1}
        kinds = {g["indices"]: g["count"] for g in t["layer_kinds"]}
        assert kinds == {"0..2": 3, "3": 1}
        assert "linear_attn" in t["layer_kinds"][0]["kind"]
        assert "self_attn" in t["layer_kinds"][1]["kind"]
        layers_node = _find(loaded_reports[name]["tree"], "layers")
        assert [c["name"] for c in layers_node["children"]] == ["0..2", "3"]


def _find(node: dict, name: str) -> dict | None:
    if node["name"] == name:
        return node
    for child in node.get("children", []):
        hit = _find(child, name)
        if hit:
            return hit
    return None


def test_legacy_checkpoint_keys_are_mapped_and_both_forms_reported(loaded_reports):
    # save_pretrained writes Llava in the legacy layout: language_model.model.layers.*
    r = loaded_reports["llava"]
    assert r["keys"]["paths"]["layers"] == {
        "module": "model.language_model.layers",
        "checkpoint": "language_model.model.layers",
    }
    assert r["keys"]["checkpoint_prefixes"]["language_model.model.layers"] == 18
    assert r["keys"]["module_prefixes"]["model.language_model.layers"] == 18
    assert {
        "checkpoint": "language_model.model.layers",
        "module": "model.language_model.layers",
        "keys": 18,
    } in r["keys"]["remapped_prefixes"]
    q = loaded_reports["qwen2_5_vl"]
    assert q["keys"]["paths"]["layers"]["checkpoint"] == "model.layers"
    assert q["keys"]["paths"]["layers"]["module"] == "model.language_model.layers"


def test_auto_classes_and_their_layer_paths(loaded_reports):
    auto = loaded_reports["qwen3_5"]["auto_classes"]
    assert auto["AutoModel"] == {"class": "Qwen3_5Model", "layers": "language_model.layers"}
    assert auto["AutoModelForImageTextToText"]["layers"] == "model.language_model.layers"
    text = loaded_reports["qwen3"]["auto_classes"]
    assert text["AutoModelForCausalLM"]["layers"] == "model.layers"
    assert text["AutoModelForImageTextToText"] is None


def test_a_vlms_text_only_class_is_built_from_its_text_config(loaded_reports, ckpts):
    """Issue 24.3: the probe showed ``AutoModelForCausalLM: Qwen3_5ForCausalLM ->
    AttributeError: 'Qwen3_5Config' object has no attribute 'vocab_size'``: it built the
    text-only class from the VLM's config. transformers builds it from the text config and
    loads the language model alone; the probe does the same and says so."""
    from rich.console import Console

    from orchestrator.commands.output.hosts import probe_tree

    entry = loaded_reports["qwen3_5"]["auto_classes"]["AutoModelForCausalLM"]
    assert entry["class"] == "Qwen3_5ForCausalLM" and "error" not in entry
    assert entry["layers"] == "model.layers" and entry["built_from"] == "text_config"
    assert entry["note"].startswith("text part only: AutoModelForCausalLM builds")
    assert "AutoModelForImageTextToText (Qwen3_5ForConditionalGeneration)" in entry["note"]
    # what the note says is what transformers does with the folder
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(
        str(ckpts["qwen3_5"]), output_loading_info=True
    )
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    assert not info["missing_keys"] and not info["mismatched_keys"]
    console = Console(width=400, record=True)
    console.print(probe_tree(loaded_reports["qwen3_5"], "h"))
    text = console.export_text()
    assert "AutoModelForCausalLM: Qwen3_5ForCausalLM -> model.layers  (text part only" in text
    assert "AttributeError" not in text


def test_tied_lm_head_is_not_missing(loaded_reports):
    r = loaded_reports["gemma3"]
    assert r["text"]["lm_head_tied"] is True
    assert "lm_head.weight" not in r["keys"]["missing"]["items"]


def test_config_only_probe_reports_every_weight_missing(ckpts, tmp_path):
    folder = tmp_path / "cfgonly"
    folder.mkdir()
    shutil.copy(ckpts["qwen3_5"] / "config.json", folder)
    r = probe(str(folder), depth=2)
    assert r["text"]["layers"] == "model.language_model.layers"
    assert r["checkpoint"]["tensors"] == 0
    assert not r["keys"]["complete"] and r["keys"]["missing"]["count"] > 50
    assert len(r["keys"]["missing"]["items"]) <= 40  # listed, not dumped
    # depth 2 = two levels below the root: model -> language_model, nothing deeper.
    assert "children" not in _find(r["tree"], "language_model")
    assert _find(r["tree"], "layers") is None


# ---- checkpoint problems ------------------------------------------------------------------


@pytest.fixture
def sharded(ckpts, tmp_path) -> Path:
    folder = save_tiny("qwen3", tmp_path / "sharded", max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").exists()
    return folder


def test_missing_and_truncated_shards_are_reported(sharded):
    shards = sorted(sharded.glob("*.safetensors"))
    assert len(shards) >= 3
    shards[0].unlink()
    data = shards[1].read_bytes()
    shards[1].write_bytes(data[: len(data) - 100])
    r = probe(str(sharded))
    assert r["checkpoint"]["missing_shards"] == [shards[0].name]
    assert [t["file"] for t in r["checkpoint"]["truncated_shards"]] == [shards[1].name]
    assert r["checkpoint"]["truncated_shards"][0]["expected"] == len(data)
    assert not r["checkpoint"]["shards_complete"]
    proc = remote_cli("--model", str(sharded), "--load")
    line = one_error_line(proc)
    assert "is incomplete" in line and shards[1].name in line and shards[0].name in line


def test_half_truncated_shard_is_not_complete_and_exits_nonzero(ckpts, tmp_path):
    # issue 12.10: the header of a half-truncated shard still lists every key, so the keys
    # looked complete and the probe exited 0.
    folder = tmp_path / "half"
    shutil.copytree(ckpts["qwen3"], folder)
    shard = folder / "model.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    r = probe(str(folder))
    assert not r["checkpoint"]["shards_complete"]
    assert not r["keys"]["complete"] and not r["keys"]["text_complete"]
    line = one_error_line(remote_cli("--model", str(folder)))
    assert "is incomplete" in line and "model.safetensors is truncated" in line
    assert f"{len(data) // 2} of {len(data)} bytes" in line


def test_pt_drafter_is_read_the_way_the_eval_reads_it(ckpts, tmp_path):
    # issue 12.10: the probe said a .pt drafter had no weights although the eval loads it.
    import torch
    from safetensors.torch import load_file

    from remote.eval.drafter import load_drafter

    d = build_drafter(tmp_path / "d", [0, 2], num_target_layers=4)
    sd = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    torch.save({"model": {"module." + k: v for k, v in sd.items()}}, d / "drafter.pt")
    r = probe(str(ckpts["qwen3_5"]), drafter=str(d))["drafter"]
    assert r["ok"], r["problems"]
    assert r["weights"] == {"fc": [HIDDEN, 2 * HIDDEN], "layers": 1}
    drafter, report = load_drafter(str(d), torch.float32, 4)  # what the eval does
    assert report.files == [str(d / "drafter.pt")]
    # A pickle that is not weights-only is refused by both, with the same one line.
    torch.save({"model": {"fc.weight": sd["fc.weight"]}, "cfg": Path("x")}, d / "drafter.pt")
    r = probe(str(ckpts["qwen3_5"]), drafter=str(d))["drafter"]
    assert not r["ok"] and any("not a weights-only state dict" in p for p in r["problems"])


def test_unexpected_and_missing_keys_listed(ckpts, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "renamed"
    shutil.copytree(ckpts["llama"], folder)
    sd = load_file(str(folder / "model.safetensors"))
    sd["model.layers.1.mlp.extra.weight"] = sd.pop("model.layers.1.mlp.up_proj.weight")
    save_file(sd, str(folder / "model.safetensors"))
    r = probe(str(folder))
    assert r["keys"]["missing"]["items"] == ["model.layers.1.mlp.up_proj.weight"]
    assert r["keys"]["missing_text"]["count"] == 1
    assert r["keys"]["unexpected"]["items"] == ["model.layers.1.mlp.extra.weight"]
    assert not r["keys"]["complete"]


# ---- bad input: one line each, exit code 3 ------------------------------------------------


def _bad_inputs(ckpts, tmp: Path) -> dict[str, tuple[Path, str]]:
    no_config = tmp / "noconfig"
    no_config.mkdir()
    unknown = tmp / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(
        json.dumps({"model_type": "qwen9_omni", "transformers_version": "9.1.0"})
    )
    unknown_old = tmp / "unknown_old"
    unknown_old.mkdir()
    (unknown_old / "config.json").write_text(json.dumps({"model_type": "qwen9_omni"}))
    bad_json = tmp / "badjson"
    bad_json.mkdir()
    (bad_json / "config.json").write_text("{not json")
    bad_index = tmp / "badindex"
    shutil.copytree(ckpts["qwen3"], bad_index)
    (bad_index / "model.safetensors.index.json").write_text('{"weight_map": [1, 2')
    cut_header = tmp / "cutheader"
    shutil.copytree(ckpts["qwen3"], cut_header)
    shard = cut_header / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:64])
    return {
        "missing folder": (tmp / "nope", "model folder not found"),
        "no config": (no_config, "no config.json"),
        "bad config json": (bad_json, "is not valid JSON"),
        "unknown model_type, newer saver": (unknown, "upgrade to >= 9.1.0"),
        "unknown model_type": (unknown_old, "upgrade transformers"),
        "unreadable index": (bad_index, "safetensors index"),
        "truncated header": (cut_header, "is truncated"),
    }


def test_bad_inputs_are_one_line_each_via_cli_and_library(ckpts, tmp_path):
    for label, (path, needle) in _bad_inputs(ckpts, tmp_path).items():
        line = one_error_line(remote_cli("--model", str(path)))
        assert needle in line, (label, line)
        with pytest.raises(UserError) as info:
            probe(str(path))
        assert needle in str(info.value) and "\n" not in str(info.value), label


# ---- drafter checks -----------------------------------------------------------------------


def test_good_drafter_passes(ckpts, tmp_path):
    d = build_drafter(
        tmp_path / "d", [0, 2], num_target_layers=4, extra_config={"max_position_embeddings": 256}
    )
    r = probe(str(ckpts["qwen3_5"]), drafter=str(d))["drafter"]
    assert r["ok"], r["problems"]
    assert r["problems"] == []
    assert r["hidden_states_indices"] == [1, 3]
    assert r["weights"]["fc"] == [HIDDEN, 2 * HIDDEN]


def test_drafter_problems_one_line_each(ckpts, tmp_path):
    d = build_drafter(
        tmp_path / "d",
        [1, 4],
        fc_width=3 * HIDDEN,
        mask_token_id=VOCAB + 5,
        block_size=1,
        num_target_layers=5,
    )
    r = probe(str(ckpts["qwen3_5"]), drafter=str(d))["drafter"]
    assert not r["ok"]
    text = "\n".join(r["problems"])
    assert "target_layer_ids [4] out of range for a 4-layer target" in text
    assert (
        f"fc input width {3 * HIDDEN} != len(target_layer_ids) 2 x target hidden {HIDDEN}" in text
    )
    assert "mask_token_id" in text and "outside the target vocabulary" in text
    assert "block_size" in text
    assert "num_target_layers 5 != target's 4" in text
    assert all("\n" not in p for p in r["problems"])


def test_drafter_hidden_and_vocab_mismatch(ckpts, tmp_path):
    d = build_drafter(tmp_path / "d", [0, 1], hidden=48, vocab=VOCAB * 2)
    r = probe(str(ckpts["qwen3"]), drafter=str(d))["drafter"]
    text = "\n".join(r["problems"])
    assert "drafter hidden_size 48 != target hidden_size 32" in text
    assert f"drafter vocab_size {VOCAB * 2} != target vocab_size {VOCAB}" in text


def test_drafter_warnings(ckpts, tmp_path):
    # The default schedule shifted by one is what a 1-based training script writes.
    shifted = [i + 1 for i in default_target_layer_ids(4, 1)]
    d = build_drafter(
        tmp_path / "d",
        shifted,
        layers=2,
        extra_config={
            "rope_theta": 1_000_000.0,
            "max_position_embeddings": 64,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    )
    r = probe(str(ckpts["qwen3_5"]), drafter=str(d))["drafter"]
    text = "\n".join(r["warnings"])
    assert "max_position_embeddings 64 < target's 256" in text
    assert "layers 0 are sliding_attention" in text and "full attention" in text
    assert "shifted by one" in text
    assert "include the last layer 3" in text


def test_the_drafters_own_rope_is_reported_not_warned_about(ckpts, tmp_path):
    """Issue 24.4: the demo's drafter (rope theta 1e6 over a 1e4 target) drew "rope theta
    differs" while the demo said it fits. A DFlash drafter rotates its own queries and keys
    with its own rotary embedding (z-lab's DFlashDraftModel builds it from the drafter's
    config; so does the eval): the target's RoPE never enters it. Both are reported; a
    difference is no warning."""
    from orchestrator.demo.train import drafter_config

    theta = drafter_config(
        type("Info", (), {"hidden_size": HIDDEN, "vocab_size": VOCAB, "num_layers": 4}),
        mask_token_id=1,
        block_size=4,
        num_layers=1,
        target_layer_ids=[1, 2],
    )["rope_theta"]  # what the demo's drafters are trained with
    d = build_drafter(
        tmp_path / "d",
        [1, 2],
        num_target_layers=4,
        extra_config={"rope_theta": theta, "rope_scaling": {"rope_type": "linear", "factor": 2}},
    )
    r = probe(str(ckpts["qwen3_5"]), drafter=str(d))["drafter"]
    assert r["ok"], r["problems"]
    assert not [w for w in r["warnings"] if "rope" in w], r["warnings"]
    assert r["rope"]["theta"] == theta == 1_000_000.0 and r["rope"]["factor"] == 2
    assert r["target_rope"]["theta"] == 10_000.0


def test_drafter_default_ids_and_prefixed_keys(ckpts, tmp_path):
    from safetensors.torch import load_file, save_file

    d = build_drafter(tmp_path / "d", [0], layers=1, num_target_layers=3)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["dflash_config"]["target_layer_ids"]
    (d / "config.json").write_text(json.dumps(cfg))
    sd = load_file(str(d / "model.safetensors"))
    save_file({"_orig_mod.model." + k: v for k, v in sd.items()}, str(d / "model.safetensors"))
    r = probe(str(ckpts["llama"]), drafter=str(d))["drafter"]
    assert r["target_layer_ids"] == default_target_layer_ids(3, 1) == [1]
    assert r["target_layer_ids_source"] == "default"
    assert r["ok"], r["problems"]  # prefixes stripped: fc, norms and layers all found
    assert r["weights"] == {"fc": [HIDDEN, HIDDEN], "layers": 1}
    assert any("training prefixes" in w for w in r["warnings"])


def test_missing_drafter_folder_is_one_line(ckpts, tmp_path):
    line = one_error_line(
        remote_cli("--model", str(ckpts["qwen3"]), "--drafter", str(tmp_path / "none"))
    )
    assert "drafter folder not found" in line


# ---- the remote CLI and the controller ----------------------------------------------------


def test_remote_cli_prints_one_json_document(ckpts):
    proc = remote_cli("--model", str(ckpts["gemma3"]), "--depth", "3")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == SCHEMA and doc["text"]["num_layers"] == 3
    assert doc["load"] is None and doc["drafter"] is None
    assert set(doc) >= {"auto_classes", "text", "parameters", "checkpoint", "keys", "host", "tree"}


def _comparable(report: dict) -> dict:
    """The report without what legitimately differs between two runs on one machine."""
    out = json.loads(json.dumps(report))
    out.pop("probe_seconds")
    for k in ("ram_available", "disk_free", "python"):
        out["host"].pop(k)
    return out


def test_probe_over_sshd_equals_local(ckpts, eval_sshd, ssh_base, make_inventory, tmp_path):
    from orchestrator.inventory import load_inventory
    from orchestrator.probe.structure import probe_structure
    from orchestrator.transport.hosts import open_host

    inv_path = make_inventory(
        hosts={
            "evalhost": ssh_host_entry(
                eval_sshd,
                ssh_base,
                roles={"eval": {"drafters": str(tmp_path), "target_model": str(ckpts["qwen3_5"])}},
            ),
            "here": {
                "transport": "local",
                "python": sys.executable,
                "workdir": str(tmp_path / "local-wd"),
            },
        }
    )
    inv = load_inventory(inv_path)
    with open_host(inv.hosts["evalhost"], inv) as h:
        over_ssh = probe_structure(h, str(ckpts["qwen3_5"]))
    with open_host(inv.hosts["here"], inv) as h:
        local = probe_structure(h, str(ckpts["qwen3_5"]))
    assert over_ssh["text"]["layers"] == "model.language_model.layers"
    assert _comparable(over_ssh) == _comparable(local)

    cli = dflash(
        "probe-structure", "--host", "evalhost", "--json", "-i", str(inv_path), timeout=300
    )
    assert cli.returncode == 0, cli.stderr
    assert _comparable(json.loads(cli.stdout)) == _comparable(over_ssh)  # model from inventory
    tree = dflash("probe-structure", "--host", "evalhost", "-i", str(inv_path), timeout=300)
    assert tree.returncode == 0, tree.stderr
    assert "model.language_model.layers" in tree.stdout and "3 linear_attention" in tree.stdout
    # Issue 24.2: the host from defaults.eval_host and a drafter NAME under its drafters
    # folder, as remote-eval resolves them (it said "Missing option '--host'", then looked
    # for the drafter under the home folder).
    drafter = build_drafter(tmp_path / "step-150", [0, 2], num_target_layers=4)
    defaults = make_inventory(
        hosts=yaml_hosts(inv_path), defaults={"eval_host": "evalhost"}
    )  # the same hosts, with a default eval host
    named = dflash("probe-structure", "--drafter", "step-150", "--json", "-i", str(defaults))
    assert named.returncode == 0, named.stderr
    doc = json.loads(named.stdout)
    assert doc["drafter"]["path"] == str(drafter) and doc["drafter"]["ok"]
    assert doc["model_path"] == str(ckpts["qwen3_5"])
    gone = str(tmp_path / "gone")
    bad = dflash(
        "probe-structure", "--host", "evalhost", "--model", gone, "-i", str(inv_path), timeout=300
    )
    assert bad.returncode != 0
    assert "model folder not found" in cli_error_line(bad)


def test_an_architecture_transformers_lacks_is_said_in_one_line(
    ckpts, loaded_reports, eval_sshd, ssh_base, make_inventory, tmp_path
):
    """Issue 48.13: a config whose `architectures` names a class transformers lacks, with a
    model_type it knows, was probed as that type's class without a word. Now one warning
    line says so, what it was built as, and what to do; the report carries it too."""
    assert all(r["warnings"] == [] for r in loaded_reports.values())
    model = tmp_path / "renamed"
    shutil.copytree(ckpts["qwen3"], model)
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["Qwen3NovaForCausalLM"]
    (model / "config.json").write_text(json.dumps(config))
    inv = make_inventory(hosts={"evalhost": ssh_host_entry(eval_sshd, ssh_base)})
    args = ("probe-structure", "--host", "evalhost", "--model", str(model), "-i", str(inv))
    tree = dflash(*args, timeout=300)
    assert tree.returncode == 0, tree.stderr
    [line] = tree.stderr.splitlines()
    assert line.startswith(
        "warning: config.json's architectures names Qwen3NovaForCausalLM, which transformers "
    ), line
    assert "as Qwen3ForCausalLM, its class for model_type 'qwen3'" in line
    assert "install a transformers that has the class" in line
    doc = json.loads(dflash(*args, "--json", timeout=300).stdout)
    assert doc["built_class"] == "Qwen3ForCausalLM" and doc["warnings"] == [line[9:]]


def yaml_hosts(path: Path) -> dict:
    """The hosts of an inventory file."""
    import yaml

    return yaml.safe_load(path.read_text())["hosts"]
