"""Is ``dflash relay`` as fast as ``scp -3``, and how cheap are a resume and a repeat?

    python benchmarks/relay.py [--size-scale 0.25] [--rounds 2]   # speed, resume, repeat
    python benchmarks/relay.py --resume-only       # the 1 GiB file fresh and resumed at 50%
    python benchmarks/relay.py --fixed-only [--baseline REV]      # unchanged repeat only

Two loopback sshd hosts (`common.relay`) as trainer and eval host; checkpoints of random
bytes: one 1 GiB file, 8 x 128 MiB, one 256 MiB file (``--size-scale`` scales them). Each
round moves each of them with every tool, all with one cipher (``--cipher``, aes128-gcm by
default, what dflash picks first): ``dflash`` (the real CLI: sha256 on both hosts, fsync,
atomic publish), ``scp -3 -O`` (the legacy protocol, the fastest plain copy through this
machine), ``scp -3`` (sftp) and ``ceiling`` (``ssh A cat | ssh B 'cat > /dev/null'``). Then
the 1 GiB file resumed at 50%, after a real relay was cut there (its saved hash states
used) and after the half was copied into the partial folder by hand (both hosts hash the
prefix again), beside a fresh relay of a file that size; and an unchanged repeat of the
8-file checkpoint, with a fresh login per host and through the masters a user's
ssh_config persists, beside its floors (``ssh evalhost true`` both ways, ``python -c
pass``). Goals (#18): dflash / ``scp -3 -O`` >= 1.0 (1 GiB, 8 files), dflash / ``scp -3``
>= 1.0 (256 MiB), resumed / fresh <= 0.6, unchanged repeat <= 0.3 s. scp neither hashes
nor fsyncs; dflash does both.

``--fixed-only`` times the unchanged repeat alone; ``--baseline REV`` runs that revision's
CLI (a git worktree, `common.baseline`) in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from functools import partial
from pathlib import Path

from common.baseline import worktree
from common.measure import goal, interleave, load_now
from common.relay import (
    MiB,
    RelayHosts,
    compiled,
    files_of,
    half_partial,
    killed_at_half,
    random_file,
    relay_hosts,
)

TOOLS = ("dflash", "scp -3 -O", "scp -3", "ceiling")


def run_dflash(h: RelayHosts, name: str, size: int | None) -> tuple[float, dict]:
    """(wall seconds, --json report) of one relay of ``name``, which must read ``size``."""
    dt, proc = h.relay(name)
    if proc.returncode != 0:
        raise SystemExit(f"dflash relay failed: {proc.stderr.strip()[-400:]}")
    rep = json.loads(proc.stdout)
    if size is not None and rep["bytes_read"] != size:
        raise SystemExit(f"dflash relay of {name} read {rep['bytes_read']} bytes, not {size}")
    return dt, rep


def run_other(h: RelayHosts, cipher: str, tool: str, src: Path, dst: Path) -> float:
    """Seconds of ``scp -3 [-O]`` or of the ``ceiling``: ``ssh A cat FILES | ssh B 'cat >
    /dev/null'``, the two ssh streams alone."""
    t = time.perf_counter()
    if tool == "ceiling":
        files = " ".join(map(str, files_of(src)))
        a = subprocess.Popen(
            h.ssh_argv(h.trainer, cipher) + [f"cat {files}"], stdout=subprocess.PIPE
        )
        b = subprocess.Popen(h.ssh_argv(h.evalhost, cipher) + ["cat > /dev/null"], stdin=a.stdout)
        a.stdout.close()
        if b.wait() != 0 or a.wait() != 0:
            raise SystemExit("the ssh cat | ssh cat ceiling failed")
    else:
        subprocess.run(
            h.scp_argv(cipher, tool == "scp -3 -O")
            + [
                f"scp://127.0.0.1:{h.trainer.port}/{src}",
                f"scp://127.0.0.1:{h.evalhost.port}/{dst}",
            ],
            check=True,
        )
    return time.perf_counter() - t


class FixedCost:
    """The unchanged repeat through a user's ssh_config that shares connections (a persisted
    master per host, started by an untimed relay first), and its floors: ``ssh evalhost
    true`` with a fresh login and through that master, and ``python -c pass``."""

    def __init__(self, base: Path):
        self.home = base / "home"  # a user's $HOME: ~/.ssh/config, the sockets' folder
        self.cm = self.home / ".ssh" / "cm"
        self.cm.mkdir(parents=True, exist_ok=True, mode=0o700)
        (self.home / ".ssh" / "config").write_text(
            f"Host *\n  ControlMaster auto\n  ControlPath {self.cm}/%C\n  ControlPersist 120\n"
        )
        self.floors: dict[str, list[float]] = {"ssh_true_s": [], "ssh_true_persisted_s": []}
        self.floors["python_s"] = []

    def relay(self, h: RelayHosts, name: str) -> float:
        """One unchanged relay of ``name`` through the persisted masters: wall seconds."""
        env = {**h.env, "HOME": str(self.home)}
        if not any(self.cm.iterdir()):  # untimed: the masters start (and then persist)
            subprocess.run(h.cli(name), capture_output=True, env=env, check=True)
        t = time.perf_counter()
        proc = subprocess.run(h.cli(name), capture_output=True, text=True, env=env)
        dt = time.perf_counter() - t
        if proc.returncode != 0 or json.loads(proc.stdout)["bytes_read"] != 0:
            raise SystemExit(f"dflash relay (persisted master) failed: {proc.stderr[-400:]}")
        return dt

    def measure_floors(self, h: RelayHosts, cipher: str) -> None:
        ssh = h.ssh_argv(h.evalhost, cipher)
        mux = [ssh[0], "-o", "ControlMaster=no", "-o", f"ControlPath={self.cm}/%C", *ssh[1:]]
        runs = {"ssh_true_s": [*ssh, "true"], "ssh_true_persisted_s": [*mux, "true"]}
        runs["python_s"] = [sys.executable, "-c", "pass"]
        for key, argv in runs.items():
            t = time.perf_counter()
            subprocess.run(argv, check=True)
            self.floors[key].append(time.perf_counter() - t)

    def print_floors(self) -> dict[str, float]:
        med = {k: round(statistics.median(v), 3) for k, v in self.floors.items()}
        print(
            f"  (floors here: one `ssh evalhost true` {med['ssh_true_s']:.3f} s with a fresh "
            f"login, {med['ssh_true_persisted_s']:.3f} s through the persisted master; "
            f"`python -c pass` {med['python_s']:.3f} s)"
        )
        return med

    def close(self) -> None:
        """End the persisted masters (a user's would stay; the benchmark's must not)."""
        for sock in self.cm.iterdir():
            subprocess.run(
                ["ssh", "-F", "/dev/null", "-o", f"ControlPath={sock}", "-O", "exit", "x"],
                capture_output=True,
            )


def make_data(h: RelayHosts, scale: float) -> dict[str, tuple[str, int]]:
    """The three checkpoints (case -> (name, bytes)) and ``step_4.bin``, the size of what a
    resume at 50% of the 1 GiB file sends."""
    big, shard, small = (int(n * MiB * scale) for n in (1024, 128, 256))
    print(
        f"making data: 1 x {big / MiB:.0f} MiB, 8 x {shard / MiB:.0f} MiB, "
        f"1 x {small / MiB:.0f} MiB"
    )
    for i in range(8):
        random_file(h.ckpts / "step_2" / f"model-{i:05d}-of-00008.safetensors", shard)
    (h.ckpts / "step_2" / "COMPLETE").write_bytes(b"")
    for name, size in (("step_1.bin", big), ("step_3.bin", small), ("step_4.bin", big - big // 2)):
        random_file(h.ckpts / name, size)
        (h.ckpts / f"{name}.COMPLETE").write_bytes(b"")
    return {
        "1 file": ("step_1.bin", big),
        "8 files": ("step_2", 8 * shard),
        "small file": ("step_3.bin", small),
    }


def modes(h: RelayHosts, args, cases: dict, fixed: FixedCost) -> dict:
    """One closure per row, each starting on an empty destination (synced, untimed) and
    returning its wall seconds (and the figures it prints)."""

    def fresh() -> None:
        for folder in (h.drafters, h.evalhost.root / "scp"):
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
        os.sync()  # nobody pays for another run's dirty pages

    def copy(case: str, tool: str) -> dict:
        fresh()
        name, size = cases[case]
        if tool == "dflash":
            dt = run_dflash(h, name, size)[0]
        else:
            dt = run_other(h, args.cipher, tool, h.ckpts / name, h.evalhost.root / "scp" / name)
        print(f"  {case:10s} {tool:9s} {size / dt / MiB:7.1f} MiB/s  ({load_now()})", flush=True)
        return {"wall": dt, "load": os.getloadavg()[0]}

    def resumed(how: str) -> dict:
        fresh()
        name, size = cases["1 file"]
        if how == "fresh half":
            return {"wall": run_dflash(h, "step_4.bin", size - size // 2)[0]}
        if how == "copied half":
            left = half_partial(h, name)
            os.sync()
            return {"wall": run_dflash(h, name, left)[0]}
        kept = killed_at_half(h, name, size)
        os.sync()
        dt, rep = run_dflash(h, name, None)
        rehashed = rep["checkpoints"][0]["destinations"]["evalhost"].get("prefix_hashed")
        print(
            f"  resumed at 50% {dt:.2f} s (cut at {kept / size:.0%}, sent "
            f"{rep['bytes_read'] / size:.0%}, prefixes hashed again {rehashed} B)  ({load_now()})"
        )
        return {"wall": dt, "kept": kept / size}

    def unchanged() -> dict:
        fresh()
        name, size = cases["8 files"]
        run_dflash(h, name, size)
        dt = run_dflash(h, name, 0)[0]
        persisted = fixed.relay(h, name)
        fixed.measure_floors(h, args.cipher)
        print(f"  unchanged repeat {dt:.3f} s, persisted master {persisted:.3f} s  ({load_now()})")
        return {"wall": dt, "persisted": persisted}

    tools = ("dflash",) if args.resume_only else TOOLS
    cases = {"1 file": cases["1 file"]} if args.resume_only else cases
    out = {f"{c}: {t}": partial(copy, c, t) for c in cases for t in tools}
    out |= {how: partial(resumed, how) for how in ("resumed", "copied half", "fresh half")}
    if not args.resume_only:
        out["unchanged"] = unchanged
    return out


def speed(args) -> None:
    """The main rows: every mode in interleaved rounds, then rates and goals."""
    base = Path(args.base or tempfile.mkdtemp(prefix="dflash-relay-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        with relay_hosts(base, {"complete_rule": "marker"}) as h:
            cases = make_data(h, args.size_scale)
            fixed = FixedCost(base)
            # the first command on a host installs dflash's host-side bundle: untimed
            h.relay("--dry-run", "step_1.bin")
            got = interleave(modes(h, args, cases, fixed), args.rounds).medians()
            fixed.close()
    finally:
        if not args.base:
            shutil.rmtree(base, ignore_errors=True)
    figures = report(args, cases, got)
    if not args.resume_only:
        figures |= fixed.print_floors()
    if args.json:
        print(json.dumps(figures, indent=2))


def report(args, cases: dict, med: dict) -> dict:
    """Rates per case and tool, then the goals; the figures as --json prints them."""
    rate = {m: cases[m.split(": ")[0]][1] / v["wall"] / MiB for m, v in med.items() if ": " in m}
    print(f"\nMiB/s, medians of {args.rounds} interleaved rounds, cipher {args.cipher}:")
    for c, (_name, size) in cases.items():
        row = {t: rate[f"{c}: {t}"] for t in TOOLS if f"{c}: {t}" in rate}
        if row:
            cells = " | ".join(f"{t} {r:6.1f}" for t, r in row.items())
            ceiling = row["dflash"] / row.get("ceiling", float("nan"))
            print(f"  {c:10s} ({size / MiB:.0f} MiB): {cells} | dflash / ceiling {ceiling:.2f}")
    loads = [v["load"] for v in med.values() if "load" in v]
    print(f"goals (load average {statistics.mean(loads):.2f} on {os.cpu_count()} cores):")
    fresh = med["1 file: dflash"]["wall"]
    rows = [("resumed at 50% / fresh", med["resumed"]["wall"] / fresh, "<=", 0.6)]
    rows += [("  no saved states (copied half)", med["copied half"]["wall"] / fresh, "<=", 0.6)]
    if not args.resume_only:
        rows = [
            (
                "1 file: dflash / scp -3 -O",
                rate["1 file: dflash"] / rate["1 file: scp -3 -O"],
                ">=",
                1.0,
            ),
            (
                "8 files: dflash / scp -3 -O",
                rate["8 files: dflash"] / rate["8 files: scp -3 -O"],
                ">=",
                1.0,
            ),
            (
                "small file: dflash / scp -3",
                rate["small file: dflash"] / rate["small file: scp -3"],
                ">=",
                1.0,
            ),
            *rows,
            ("unchanged repeat, s", med["unchanged"]["wall"], "<=", 0.3),
            ("unchanged, persisted master, s", med["unchanged"]["persisted"], "<=", 0.3),
        ]
    figures = {"rates_mib_s": rate, "goals": {}}
    for label, value, op, bound in rows:
        met = goal(f"  {label:34s}", value, op, bound, digits=3)
        figures["goals"][label.strip()] = {
            "value": round(value, 3),
            "goal": f"{op} {bound}",
            "met": met,
        }
    half = (cases["1 file"][1] - cases["1 file"][1] // 2) / MiB
    print(
        f"  (the cut relays kept {med['resumed']['kept']:.0%} of the file, median; resumed / a "
        f"fresh relay of a {half:.0f} MiB file "
        f"{med['resumed']['wall'] / med['fresh half']['wall']:.3f}: "
        "that relay's share is its fixed cost)"
    )
    return figures


def fixed_only(args) -> None:
    """The unchanged re-relay rows alone, for this checkout and, with ``--baseline``, that
    revision's, in interleaved rounds."""
    base = Path(args.base or tempfile.mkdtemp(prefix="dflash-relay-fixed-"))
    base.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        trees = {"this": Path(__file__).resolve().parent.parent}
        if args.baseline:
            trees["baseline"] = stack.enter_context(worktree(args.baseline))
            compiled(trees["baseline"])
        if not args.base:
            stack.callback(shutil.rmtree, base, ignore_errors=True)
        h = stack.enter_context(relay_hosts(base, {"complete_rule": "marker"}))
        shard = max(1, int(128 * MiB * args.size_scale))
        for i in range(8):
            random_file(h.ckpts / "step_2" / f"model-{i:05d}-of-00008.safetensors", shard)
        (h.ckpts / "step_2" / "COMPLETE").write_bytes(b"")
        fixed = FixedCost(base)
        stack.callback(fixed.close)

        def unchanged(tree: Path) -> dict:
            h.tree = tree
            private = run_dflash(h, "step_2", 0)[0]
            persisted = fixed.relay(h, "step_2")
            fixed.measure_floors(h, args.cipher)
            print(
                f"  {tree}: private masters {private:.3f} s, persisted {persisted:.3f} s "
                f"({load_now()})"
            )
            return {"wall": private, "persisted": persisted}

        for tree in trees.values():  # untimed: bundles pushed, the checkpoint relayed once
            h.tree = tree
            run_dflash(h, "step_2", None)
            fixed.relay(h, "step_2")
        runs = {label: partial(unchanged, tree) for label, tree in trees.items()}
        med = interleave(runs, args.rounds).medians()
    print(f"\nunchanged re-relay of 8 files, s, medians of {args.rounds} interleaved rounds:")
    for label, m in med.items():
        print(f"  {label:8s} private masters {m['wall']:.3f} | persisted {m['persisted']:.3f}")
    if "baseline" in med:
        for key, mode in (("wall", "private"), ("persisted", "persisted")):
            ratio = med["this"][key] / med["baseline"][key]
            print(f"  this / {args.baseline[:12]}, {mode}: {ratio:.2f}")
    fixed.print_floors()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-scale", type=float, default=1.0, help="scale every checkpoint")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (median)")
    ap.add_argument("--cipher", default="aes128-gcm@openssh.com", help="every tool's cipher")
    ap.add_argument("--base", default=None, help="working folder (default: a temp folder)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON too")
    ap.add_argument("--resume-only", action="store_true", help="only the resume rows")
    ap.add_argument("--fixed-only", action="store_true", help="only the unchanged repeat")
    ap.add_argument("--baseline", help="with --fixed-only: also this revision's CLI (a commit)")
    args = ap.parse_args()
    fixed_only(args) if args.fixed_only else speed(args)


if __name__ == "__main__":
    main()
