"""`dflash probe-structure`: a model's real shape on a host, as a tree or JSON."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.tree import Tree

from orchestrator.commands.common import InventoryOption, JsonOption, inventory
from orchestrator.commands.output import console, print_json
from orchestrator.probe.structure import DEFAULT_DEPTH, probe_structure, resolve_model
from orchestrator.sizes import human_bytes
from orchestrator.transport.hosts import open_host


def probe_command(
    ctx: typer.Context,
    host: Annotated[str, typer.Option("--host", help="Inventory host to probe on.")],
    model: Annotated[
        str | None,
        typer.Option(
            "--model", help="Model folder on the host (default: the host's eval target_model)."
        ),
    ] = None,
    drafter: Annotated[
        str | None,
        typer.Option(
            "--drafter", help="DFlash drafter folder on the host to check against the model."
        ),
    ] = None,
    load: Annotated[
        bool,
        typer.Option(
            "--load", help="Load the text backbone and verify hidden states (reads weights)."
        ),
    ] = False,
    depth: Annotated[
        int, typer.Option("--depth", min=0, help="Module tree depth.")
    ] = DEFAULT_DEPTH,
    json_out: JsonOption = False,
    inventory_path: InventoryOption = None,
) -> None:
    """What is this model, really? Classes, layer paths, layer kinds, sizes, keys, fit."""
    inv = inventory(ctx, inventory_path)
    spec = inv.host(host)
    model_path = resolve_model(spec, model)
    with open_host(spec, inv) as h:
        report = probe_structure(h, model_path, drafter=drafter, load=load, depth=depth)
    if json_out:
        print_json(report)
    else:
        console.print(render(report, host))
    drafter_bad = report.get("drafter") and not report["drafter"]["ok"]
    load_bad = report.get("load") and not report["load"]["ok"]
    if drafter_bad or load_bad:
        raise typer.Exit(1)


def _mark(ok: bool | None) -> str:
    return "[green]yes[/]" if ok else ("[red]no[/]" if ok is not None else "[yellow]?[/]")


def render(r: dict, host: str) -> Tree:
    """The report as a rich tree for people."""
    t = r["text"]
    root = Tree(
        f"[bold]{r['model_path']}[/] on [bold]{host}[/]  "
        f"({r['model_type']}, {'VLM' if r['is_vlm'] else 'text'}, {r['dtype']})"
    )
    cls = root.add("classes")
    cls.add(f"built: {r['built_class']}")
    for name, v in r["auto_classes"].items():
        if v is None:
            cls.add(f"{name}: -")
        else:
            cls.add(f"{name}: {v['class']} -> " + (v.get("layers") or f"[red]{v.get('error')}[/]"))
    paths = root.add("text decoder")
    for name in ("layers", "embed_tokens", "norm", "lm_head"):
        forms = r["keys"]["paths"][name]
        ck = forms["checkpoint"]
        extra = f"  [dim](checkpoint: {ck})[/]" if ck and ck != forms["module"] else ""
        paths.add(f"{name}: [cyan]{forms['module']}[/]{extra}")
    paths.add(
        f"{t['num_layers']} layers, hidden {t['hidden_size']}, vocab {t['vocab_size']}, "
        f"heads {t['heads']}"
    )
    if t["layer_types_config"]:
        paths.add(
            "layer types: " + ", ".join(f"{n} {k}" for k, n in t["layer_types_config"].items())
        )
    for g in t["layer_kinds"]:
        paths.add(f"{g['count']} x {g['kind']} [dim]({g['indices']})[/]")
    p = r["parameters"]
    sizes = root.add("parameters")
    for k in ("text", "vision", "other", "total"):
        sizes.add(f"{k}: {p[k]['params']:,} ({human_bytes(p[k]['bytes'])})")
    ck = r["checkpoint"]
    keys = r["keys"]
    c = root.add(
        f"checkpoint: {len(ck['files'])} shard(s), {ck['tensors']} tensors, "
        f"{human_bytes(ck['bytes_on_disk'])}, complete {_mark(keys['complete'])}"
    )
    c.add("prefixes: " + ", ".join(f"{k} ({n})" for k, n in ck_prefixes(keys)))
    for m in keys["remapped_prefixes"]:
        c.add(f"remapped: {m['checkpoint']} -> {m['module']} ({m['keys']} keys)")
    for label in ("missing", "unexpected"):
        if keys[label]["count"]:
            c.add(f"[red]{label}: {keys[label]['count']}[/] " + ", ".join(keys[label]["items"][:5]))
    for s in ck["missing_shards"]:
        c.add(f"[red]missing shard {s}[/]")
    for s in ck["truncated_shards"]:
        c.add(f"[red]truncated shard {s['file']}: {s['size']} of {s['expected']} bytes[/]")
    h = r["host"]
    hn = root.add("host")
    for name, k in h["kernels"].items():
        hn.add(f"{name}: {_mark(k['importable'])}")
    hn.add(
        f"RAM available {human_bytes(h['ram_available'])} vs text-only needs "
        f"{human_bytes(h['text_only_bytes_needed'])}: fits {_mark(h['fits_in_ram'])}"
    )
    hn.add(f"disk free {human_bytes(h['disk_free'])}")
    if r.get("drafter"):
        d = r["drafter"]
        dn = root.add(
            f"drafter {d['path']}: ok {_mark(d['ok'])}  ids {d['target_layer_ids']} "
            f"block {d['block_size']}"
        )
        for line in d["problems"]:
            dn.add(f"[red]problem:[/] {line}")
        for line in d["warnings"]:
            dn.add(f"[yellow]warning:[/] {line}")
    if r.get("load"):
        ld = r["load"]
        ln = root.add(f"load: ok {_mark(ld['ok'])}")
        ln.add(
            f"hidden states {ld['hidden_states']} (expected {ld['hidden_states_expected']}), "
            f"width ok {_mark(ld['hidden_state_width_ok'])}"
        )
        ln.add(f"layer outputs equal hidden_states\\[i+1]: {_mark(ld['layer_outputs_match'])}")
        ln.add(f"last entry is {ld['last_hidden_state']}")
    tree = root.add("modules")
    _tree(tree, r["tree"])
    return root


def ck_prefixes(keys: dict) -> list[tuple[str, int]]:
    return list(keys["checkpoint_prefixes"].items())[:12]


def _tree(parent: Tree, node: dict) -> None:
    count = f"{node['count']} x " if "count" in node else ""
    label = f"{node['name'] or '(root)'}: {count}{node['class']} [dim]{node['params']:,}[/]"
    branch = parent.add(label)
    for child in node.get("children", []):
        _tree(branch, child)


def register(app: typer.Typer) -> None:
    app.command("probe-structure")(probe_command)
