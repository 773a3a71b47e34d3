"""How hosts look to people: `hosts`, `hosts check`, `probe-structure` and `env`."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from rich.tree import Tree

from orchestrator.commands.output.base import console, err_console, flag, mark, plain, show
from orchestrator.commands.output.tables import Col, Grid
from orchestrator.printable import printable
from orchestrator.probe.facts import HostFacts
from orchestrator.sizes import human_bytes


def render_hosts(listing: dict) -> None:
    """`hosts`: one row per host of `inventory.listing`."""
    table = Grid(
        f"hosts in {listing['inventory']}",
        [
            Col("name", "id"),
            Col("transport", "id", drop=1),
            Col("address"),
            Col("roles"),
            Col("python", drop=2),
            Col("workdir"),
        ],
    )
    for r in listing["hosts"]:
        table.row(
            r["name"],
            r["transport"],
            r["address"] + (f" via {r['jump']}" if r["jump"] else ""),
            ", ".join(r["roles"]) or "-",
            r["python"],
            r["workdir"],
        )
    show(table)


def render_check(results: list[HostFacts]) -> None:
    """`hosts check`: the table of facts, then what its optional packages are for."""
    show(check_table(results))
    if any(r.ok for r in results):
        for line in PACKAGES_NOTE:
            console.print(f"[dim]{line}[/]")


def check_json(results: list[HostFacts]) -> list[dict]:
    return [r.to_json() for r in results]


ENGINE_PACKAGES = ("torch", "transformers", "safetensors")
OPTIONAL = ("fla",)  # no role needs them
PACKAGES_NOTE = (
    "-: not installed, not needed: the eval role needs torch, transformers and safetensors; "
    "a trainer's relay needs python3's standard library only (the three: for parity only).",
    "*: optional. fla (flash-linear-attention): linear-attention kernels; without them "
    "transformers runs linear-attention layers (Qwen3.5's Gated DeltaNet) on a slower "
    "torch path.",
)


def _packages(r: HostFacts) -> Text:
    """One line per package: its version or a mark `PACKAGES_NOTE` explains."""
    found = r.facts["packages"]
    cell = Text()
    for i, name in enumerate((*ENGINE_PACKAGES, *OPTIONAL)):
        cell.append(("\n" if i else "") + f"{name} ")
        if found.get(name):
            cell.append(printable(found[name]))
        elif name in r.needed:
            cell.append("missing", "bold red")
        else:
            cell.append("- *" if name in OPTIONAL else "-", "dim")
    return cell


def check_table(results: list[HostFacts]) -> Grid:
    """One row per host: its roles, and the packages in one column, one line each."""
    table = Grid(
        "host check",
        [
            Col("host", "id"),
            Col("ok", "id"),
            Col("os", drop=3),
            Col("cpus", "num", justify="right"),
            Col("ram avail/total", "num"),
            Col("disk free", "num", justify="right"),
            Col("python", drop=2),
            Col("roles", drop=1),
            Col("packages", "id"),
        ],
    )
    for r in results:
        roles = ", ".join(r.roles) or "-"
        if not r.ok:
            table.row(r.host, flag(False), *["-"] * 5, roles, "-")
            continue
        f = r.facts
        table.row(
            r.host,
            flag(not r.missing),
            f["os"],
            str(f["cpus"]),
            f"{human_bytes(f['memory']['available'])} / {human_bytes(f['memory']['total'])}",
            human_bytes(f["disk_free"]),
            f["python"],
            roles,
            _packages(r),
        )
    return table


# `env`'s name for a distribution where its own would mislead: "dflash" is z-lab's.
ENV_LABELS = {"dflash": "dflash (z-lab)"}


def render_env(info: dict) -> None:
    """`env`: one aligned line per version, then the inventory found and from where."""
    dist = info["distribution"]
    installed = f"{dist['name']} {dist['version']}" if dist["version"] else "not installed"
    rows = [
        ("dflash", f"{info['dflash']} ({info['dflash_path']}; {installed})"),
        (
            "python",
            f"{info['python']} ({info['python_executable']}{', venv' if info['in_venv'] else ''})",
        ),
        ("platform", info["platform"]),
    ]
    rows += [
        (ENV_LABELS.get(name, name), version or "not installed")
        for name, version in info["packages"].items()
    ]
    rows.append(("openssh", info["openssh"] or "not installed"))
    inv = info["inventory"]
    rows.append(
        (
            "inventory",
            f"{inv['path']} (from {inv['from']}{'' if inv['exists'] else '; no such file'})",
        )
    )
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        console.print(f"{key:<{width}}  {plain(value)}", soft_wrap=True)


def render_probe(report: dict, host: str) -> None:
    """`probe-structure`: the report's warnings, one line each on stderr, then its tree."""
    for warning in report.get("warnings") or []:
        err_console.print(f"[yellow]warning:[/] {plain(warning)}", soft_wrap=True)
    show(probe_tree(report, host))


def _literal(value: Any) -> Any:
    """Every string of a host's report (keys too) as literal text for the tree's markup."""
    if isinstance(value, str):
        return plain(value)
    if isinstance(value, dict):
        return {_literal(k): _literal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_literal(v) for v in value]
    return value


def probe_tree(r: dict, host: str) -> Tree:
    """A probe report as a rich tree, the host's names as text."""
    r, host = _literal(r), plain(host)
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
            note = f"  [dim]({v['note']})[/]" if v.get("note") else ""
            cls.add(
                f"{name}: {v['class']} -> "
                + (v.get("layers") or f"[red]{v.get('error')}[/]")
                + note
            )
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
        f"{human_bytes(ck['bytes_on_disk'])}, complete {mark(keys['complete'])}"
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
        hn.add(f"{name}: {mark(k['importable'])}")
    hn.add(
        f"RAM available {human_bytes(h['ram_available'])} vs text-only needs "
        f"{human_bytes(h['text_only_bytes_needed'])}: fits {mark(h['fits_in_ram'])}"
    )
    hn.add(f"disk free {human_bytes(h['disk_free'])}")
    if r.get("drafter"):
        d = r["drafter"]
        dn = root.add(
            f"drafter {d['path']}: ok {mark(d['ok'])}  ids {d['target_layer_ids']} "
            f"block {d['block_size']}"
        )
        for line in d["problems"]:
            dn.add(f"[red]problem:[/] {line}")
        for line in d["warnings"]:
            dn.add(f"[yellow]warning:[/] {line}")
    if r.get("load"):
        ld = r["load"]
        ln = root.add(f"load: ok {mark(ld['ok'])}")
        ln.add(
            f"hidden states {ld['hidden_states']} (expected {ld['hidden_states_expected']}), "
            f"width ok {mark(ld['hidden_state_width_ok'])}"
        )
        ln.add(f"layer outputs equal hidden_states\\[i+1]: {mark(ld['layer_outputs_match'])}")
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
