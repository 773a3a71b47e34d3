"""Relay speed: ``dflash relay`` against ``scp -3`` and the ssh pipe ceiling, same hosts, same run.

    python benchmarks/relay.py                          # 1 GiB file, 8 x 128 MiB, 256 MiB
    python benchmarks/relay.py --size-scale 0.25 --rounds 2

Starts two loopback sshd servers (benchmarks/relay_hosts.py) as trainer and eval host and
makes three checkpoints of random bytes: one 1 GiB file, an 8 x 128 MiB folder and one
256 MiB file (all scaled by ``--size-scale``). Each round, in turn, moves each of them with:

- ``dflash``: the real CLI (``python -m orchestrator relay``: sha256 on both hosts, fsync,
  atomic publish), wall time from process start to exit;
- ``scp -3 -O``: the legacy protocol, the fastest plain copy through this machine;
- ``scp -3``: the default (sftp) protocol;
- ``ceiling``: ``ssh A cat FILES | ssh B 'cat > /dev/null'`` (no copy tool, no disk).

All use the same cipher (``--cipher``, aes128-gcm by default: what dflash picks first).
Then, per round, a relay resumed at 50% of the 1 GiB case, twice: after a real relay was
cut there (the eval host's sessions killed once half the file is in its partial folder:
that relay's saved hash states stay, so neither host hashes the kept prefix again), and
after the first half was copied into the partial folder by hand (no saved states: both
hosts hash the prefix, the fallback); and a repeat relay of the unchanged 8-file
checkpoint. Prints medians and the goals' ratios (issue #18):

- dflash / ``scp -3 -O`` >= 1.0 on the 1 GiB file and the 8-file checkpoint;
- dflash / ``scp -3`` >= 1.0 on the 256 MiB file (fixed cost is the gap);
- resumed at 50% / fresh <= 0.6 (wall time; the fallback's ratio is printed beside it);
- unchanged repeat <= 0.3 s of wall time, CLI start included, measured twice: with a fresh
  login per host (no ssh_config: the relay's private masters), and with the ssh_config a user
  who shares connections has (ControlMaster auto, ControlPath, ControlPersist: the relay
  uses that persisted master); printed beside their floors, one ``ssh evalhost true`` with
  a fresh login and through the persisted master, and one ``python -c pass``;

with the 1-minute load average beside them. ``--fixed-only`` runs only those unchanged rows
(quick: one small 8-file checkpoint); with ``--baseline TREE`` (another checkout, e.g. a
``git worktree`` of main) it runs that checkout's CLI too, interleaved, for a same-run
before/after. Caches are written back (sync) before every run
so nobody pays for another's dirty pages. Ratios, not absolute numbers, carry over between
machines; scp neither hashes nor fsyncs, dflash does both.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from relay_hosts import MiB, RelayHosts, load_average, random_file, relay_hosts  # noqa: E402

TOOLS = ("dflash", "scp -3 -O", "scp -3", "ceiling")


LAST: dict = {}  # the last dflash relay's --json report


def run_dflash(h: RelayHosts, name: str, size: int | None) -> float:
    dt, proc = h.relay(name)
    if proc.returncode != 0:
        raise SystemExit(f"dflash relay failed: {proc.stderr.strip()[-400:]}")
    rep = LAST["report"] = json.loads(proc.stdout)
    if size is not None and rep["bytes_read"] != size:
        raise SystemExit(f"dflash relay of {name} read {rep['bytes_read']} bytes, not {size}")
    return dt


def run_scp(h: RelayHosts, cipher: str, legacy: bool, src: Path, dst: Path) -> float:
    argv = h.scp_argv(cipher, legacy) + [
        f"scp://127.0.0.1:{h.trainer.port}/{src}",
        f"scp://127.0.0.1:{h.evalhost.port}/{dst}",
    ]
    t = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - t


def run_ceiling(h: RelayHosts, cipher: str, files: list[Path]) -> float:
    """``ssh A cat FILES | ssh B 'cat > /dev/null'``: the two ssh streams alone."""
    t = time.perf_counter()
    a = subprocess.Popen(
        h.ssh_argv(h.trainer, cipher) + ["cat " + " ".join(map(str, files))],
        stdout=subprocess.PIPE,
    )
    b = subprocess.Popen(h.ssh_argv(h.evalhost, cipher) + ["cat > /dev/null"], stdin=a.stdout)
    a.stdout.close()
    if b.wait() != 0 or a.wait() != 0:
        raise SystemExit("the ssh cat | ssh cat ceiling failed")
    return time.perf_counter() - t


def files_of(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def half_partial(h: RelayHosts, name: str) -> int:
    """Put the first half of every file of checkpoint `name` into the destination's partial
    folder (the bytes a relay killed at 50% leaves, but no saved hash states: the source's
    are removed too, so both hosts hash the kept prefix, the fallback); returns the bytes
    still to send."""
    shutil.rmtree(h.trainer.root / "dflash" / "relay-states", ignore_errors=True)
    src = h.ckpts / name
    partial = h.drafters / f".partial-{name}"
    left = 0
    for f in files_of(src):
        rel = f.relative_to(src) if src.is_dir() else Path(name)
        dst = partial / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        size = f.stat().st_size
        with open(f, "rb") as fin, open(dst, "wb") as fout:
            fout.write(fin.read(size // 2))
        left += size - size // 2
    return left


def killed_at_half(h: RelayHosts, name: str, size: int) -> int:
    """Start a relay of single-file checkpoint `name` and cut it (the eval host's sessions
    killed, a dropped link) once half of it is in the partial folder; returns the bytes
    the partial holds once the host-side writer has drained."""
    partial = h.drafters / f".partial-{name}" / name
    proc = subprocess.Popen(
        h.cli(name), env=h.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    while proc.poll() is None and (partial.stat().st_size if partial.exists() else 0) < size // 2:
        time.sleep(0.002)
    h.evalhost.kill_sessions()
    proc.wait(timeout=120)
    last = -1
    while (now := partial.stat().st_size) != last:
        last = now
        time.sleep(0.3)
    return now


class FixedCost:
    """The unchanged repeat's other rows: the same relay with a user's ssh_config that shares
    connections (a persisted master per host, started by an untimed relay first), and the
    floors: ``ssh evalhost true`` with a fresh login and through that master, and
    ``python -c pass`` (every CLI pays its interpreter's start)."""

    def __init__(self, base: Path):
        self.home = base / "home"  # a user's $HOME: ~/.ssh/config, the sockets' folder
        self.cm = self.home / ".ssh" / "cm"
        self.cm.mkdir(parents=True, exist_ok=True, mode=0o700)
        (self.home / ".ssh" / "config").write_text(
            f"Host *\n  ControlMaster auto\n  ControlPath {self.cm}/%C\n  ControlPersist 120\n"
        )
        self.persisted: list[float] = []
        self.ssh_true: list[float] = []
        self.ssh_true_mux: list[float] = []
        self.python: list[float] = []

    def relay(self, h: RelayHosts, name: str) -> float:
        """One unchanged relay of `name` through the persisted masters: wall seconds."""
        env = {**h.env, "HOME": str(self.home)}
        if not any(self.cm.iterdir()):  # untimed: the masters start (and then persist)
            subprocess.run(h.cli(name), capture_output=True, env=env, check=True)
        t = time.perf_counter()
        proc = subprocess.run(h.cli(name), capture_output=True, text=True, env=env)
        dt = time.perf_counter() - t
        if proc.returncode != 0 or json.loads(proc.stdout)["bytes_read"] != 0:
            raise SystemExit(f"dflash relay (persisted master) failed: {proc.stderr[-400:]}")
        return dt

    def measure(self, h: RelayHosts, name: str, cipher: str) -> None:
        self.persisted.append(self.relay(h, name))
        self.measure_floors(h, cipher)

    def measure_floors(self, h: RelayHosts, cipher: str) -> None:
        ssh = h.ssh_argv(h.evalhost, cipher)
        mux = ["-o", "ControlMaster=no", "-o", f"ControlPath={self.cm}/%C"]
        for argv, out in ((ssh, self.ssh_true), ([ssh[0], *mux, *ssh[1:]], self.ssh_true_mux)):
            t = time.perf_counter()
            subprocess.run([*argv, "true"], check=True)
            out.append(time.perf_counter() - t)
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        self.python.append(time.perf_counter() - t)

    def floors(self) -> dict[str, float]:
        med = statistics.median
        return {
            "ssh_true_s": round(med(self.ssh_true), 3),
            "ssh_true_persisted_s": round(med(self.ssh_true_mux), 3),
            "python_s": round(med(self.python), 3),
        }

    def close(self) -> None:
        """End the persisted masters (a user's would stay; the benchmark's must not)."""
        for sock in self.cm.iterdir():
            subprocess.run(
                ["ssh", "-F", "/dev/null", "-o", f"ControlPath={sock}", "-O", "exit", "x"],
                capture_output=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-scale", type=float, default=1.0, help="scale every checkpoint")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (median)")
    ap.add_argument("--cipher", default="aes128-gcm@openssh.com", help="every tool's cipher")
    ap.add_argument("--base", default=None, help="working folder (default: a temp folder)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON too")
    ap.add_argument(
        "--resume-only",
        action="store_true",
        help="only the resume rows: the 1 GiB file fresh (dflash) and resumed at 50%%",
    )
    ap.add_argument(
        "--fixed-only", action="store_true", help="only the unchanged re-relay rows (quick)"
    )
    ap.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="with --fixed-only: another checkout whose CLI runs too, interleaved",
    )
    args = ap.parse_args()
    if args.fixed_only:
        fixed_only(args)
        return

    base = Path(args.base or tempfile.mkdtemp(prefix="dflash-relay-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    loads: list[float] = []
    try:
        with relay_hosts(base, {"complete_rule": "marker"}) as h:
            scp_dst = h.evalhost.root / "scp"
            big, shard, small = (int(n * MiB * args.size_scale) for n in (1024, 128, 256))
            print(
                f"making data: 1 x {big / MiB:.0f} MiB, 8 x {shard / MiB:.0f} MiB, "
                f"1 x {small / MiB:.0f} MiB",
                flush=True,
            )
            cases = {"1 file": ("step_1.bin", big), "8 files": ("step_2", 8 * shard)}
            cases["small file"] = ("step_3.bin", small)
            random_file(h.ckpts / "step_1.bin", big)
            for i in range(8):
                random_file(h.ckpts / "step_2" / f"model-{i:05d}-of-00008.safetensors", shard)
            random_file(h.ckpts / "step_3.bin", small)
            (h.ckpts / "step_2" / "COMPLETE").write_bytes(b"")
            random_file(h.ckpts / "step_4.bin", big - big // 2)  # what a resume at 50% sends
            for n in ("step_1.bin", "step_3.bin", "step_4.bin"):
                (h.ckpts / f"{n}.COMPLETE").write_bytes(b"")
            tools = ("dflash",) if args.resume_only else TOOLS
            if args.resume_only:
                cases = {"1 file": cases["1 file"]}
            times = {c: {t: [] for t in tools} for c in cases}
            resumed: list[float] = []
            copied: list[float] = []  # resumed from a hand-copied half: no saved states
            halves: list[float] = []  # a fresh relay of a file of the resumed half's size
            kept: list[float] = []
            unchanged: list[float] = []
            fixed = FixedCost(base)

            def fresh() -> None:
                shutil.rmtree(h.drafters, ignore_errors=True)
                shutil.rmtree(scp_dst, ignore_errors=True)
                h.drafters.mkdir()
                scp_dst.mkdir()
                os.sync()  # untimed: nobody pays for another run's dirty pages

            # Untimed warm-up: the first command on a host installs dflash's host-side
            # bundle (once per version and host), which is installation, not transfer.
            h.relay("--dry-run", "step_1.bin")
            for rnd in range(args.rounds):
                for case, (name, size) in cases.items():
                    order = tools if rnd % 2 == 0 else tools[::-1]
                    for tool in order:
                        fresh()
                        src = h.ckpts / name
                        if tool == "dflash":
                            dt = run_dflash(h, name, size)
                        elif tool == "ceiling":
                            dt = run_ceiling(h, args.cipher, files_of(src))
                        else:
                            dt = run_scp(h, args.cipher, tool == "scp -3 -O", src, scp_dst / name)
                        times[case][tool].append(dt)
                        loads.append(os.getloadavg()[0])
                        print(
                            f"  round {rnd + 1} {case:10s} {tool:9s} {size / dt / MiB:7.1f} MiB/s"
                            f"  ({load_average()})",
                            flush=True,
                        )
                name, size = cases["1 file"]
                ways = ("killed", "copied", "half")
                for how in ways if rnd % 2 == 0 else ways[::-1]:
                    fresh()
                    if how == "half":
                        halves.append(run_dflash(h, "step_4.bin", big - big // 2))
                    elif how == "killed":
                        have = killed_at_half(h, name, size)
                        os.sync()
                        resumed.append(run_dflash(h, name, None))
                        kept.append(have / size)
                        st = LAST["report"]["checkpoints"][0]["destinations"]["evalhost"]
                        rehashed = st.get("prefix_hashed")
                        sent = LAST["report"]["bytes_read"] / size
                    else:
                        left = half_partial(h, name)
                        os.sync()
                        copied.append(run_dflash(h, name, left))
                print(
                    f"  round {rnd + 1} resumed at 50% {resumed[-1]:.2f} s (cut at "
                    f"{kept[-1]:.0%}, sent {sent:.0%}, prefixes hashed again {rehashed} B; from "
                    f"a copied half {copied[-1]:.2f} s; fresh half-size file {halves[-1]:.2f} s)"
                    f"  ({load_average()})",
                    flush=True,
                )
                if args.resume_only:
                    continue
                name, size = cases["8 files"]
                fresh()
                run_dflash(h, name, size)
                unchanged.append(run_dflash(h, name, 0))
                fixed.measure(h, name, args.cipher)
                print(
                    f"  round {rnd + 1} unchanged repeat "
                    f"{unchanged[-1]:.3f} s, with a persisted master {fixed.persisted[-1]:.3f} s"
                    f"  ({load_average()})",
                    flush=True,
                )
            fixed.close()
    finally:
        if not args.base:
            shutil.rmtree(base, ignore_errors=True)

    med = {c: {t: statistics.median(v) for t, v in tt.items()} for c, tt in times.items()}
    rate = {c: {t: cases[c][1] / s / MiB for t, s in m.items()} for c, m in med.items()}

    def speed(case: str, base: str) -> float:  # dflash's rate over the baseline's
        return med[case][base] / med[case]["dflash"]

    goals = (
        []
        if args.resume_only
        else [
            ("1 file: dflash / scp -3 -O", speed("1 file", "scp -3 -O"), ">=", 1.0),
            ("8 files: dflash / scp -3 -O", speed("8 files", "scp -3 -O"), ">=", 1.0),
            ("small file: dflash / scp -3", speed("small file", "scp -3"), ">=", 1.0),
        ]
    )
    goals += [
        ("resumed at 50% / fresh", statistics.median(resumed) / med["1 file"]["dflash"], "<=", 0.6),
        (
            "  no saved states (copied half)",
            statistics.median(copied) / med["1 file"]["dflash"],
            "<=",
            0.6,
        ),
    ]
    if not args.resume_only:
        goals += [
            ("unchanged repeat, s", statistics.median(unchanged), "<=", 0.3),
            ("unchanged, persisted master, s", statistics.median(fixed.persisted), "<=", 0.3),
        ]
    print(f"\nMiB/s, medians of {args.rounds} interleaved rounds, cipher {args.cipher}:")
    for c in cases:
        row = " | ".join(f"{t} {rate[c][t]:6.1f}" for t in tools)
        ceiling = rate[c]["dflash"] / rate[c].get("ceiling", float("nan"))
        print(f"  {c:10s} ({cases[c][1] / MiB:.0f} MiB): {row} | dflash / ceiling {ceiling:.2f}")
    mean_load = statistics.mean(loads) if loads else os.getloadavg()[0]
    print(f"goals (mean load average {mean_load:.2f} on {os.cpu_count()} cores):")
    figures = {"rates_mib_s": rate, "load_average": round(mean_load, 2), "goals": {}}
    for label, value, op, goal in goals:
        met = value >= goal if op == ">=" else value <= goal
        figures["goals"][label] = {"value": round(value, 3), "goal": f"{op} {goal}", "met": met}
        print(f"  {label:34s} {value:6.3f}  (goal {op} {goal}: {'met' if met else 'NOT met'})")
    half = statistics.median(halves)
    print(
        f"  (the cut relays kept {statistics.median(kept):.0%} of the file, median; resumed / "
        f"a fresh relay of a {(big - big // 2) / MiB:.0f} MiB file "
        f"{statistics.median(resumed) / half:.3f}: that relay's share is its fixed cost)"
    )
    if args.resume_only:
        if args.json:
            print(json.dumps(figures, indent=2))
        return
    floors = fixed.floors()
    print(
        f"  (floors here: one `ssh evalhost true` {floors['ssh_true_s']:.3f} s with a fresh "
        f"login, {floors['ssh_true_persisted_s']:.3f} s through the persisted master; "
        f"`python -c pass` {floors['python_s']:.3f} s)"
    )
    figures.update(floors)
    if args.json:
        print(json.dumps(figures, indent=2))


def fixed_only(args: argparse.Namespace) -> None:
    """The unchanged re-relay rows alone (`--fixed-only`), for this checkout and, with
    ``--baseline``, another one: interleaved rounds, medians, load average beside each."""
    from relay_hosts import compiled

    trees = {"this": Path(__file__).resolve().parent.parent}
    if args.baseline is not None:
        compiled(args.baseline.resolve())
        trees["baseline"] = args.baseline.resolve()
    base = Path(args.base or tempfile.mkdtemp(prefix="dflash-relay-fixed-"))
    base.mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict[str, list[float]]] = {t: {"private": [], "persisted": []} for t in trees}
    loads: list[float] = []
    try:
        with relay_hosts(base, {"complete_rule": "marker"}) as h:
            shard = max(1, int(128 * MiB * args.size_scale))
            for i in range(8):
                random_file(h.ckpts / "step_2" / f"model-{i:05d}-of-00008.safetensors", shard)
            (h.ckpts / "step_2" / "COMPLETE").write_bytes(b"")
            fixed = FixedCost(base)
            for tree in trees.values():  # untimed: bundles pushed, the checkpoint relayed once
                h.tree = tree
                run_dflash(h, "step_2", None)
                fixed.relay(h, "step_2")
            for rnd in range(args.rounds):
                order = list(trees) if rnd % 2 == 0 else list(trees)[::-1]
                for label in order:
                    h.tree = trees[label]
                    rows[label]["private"].append(run_dflash(h, "step_2", 0))
                    loads.append(os.getloadavg()[0])
                    rows[label]["persisted"].append(fixed.relay(h, "step_2"))
                    loads.append(os.getloadavg()[0])
                    fixed.measure_floors(h, args.cipher)
                    print(
                        f"  round {rnd + 1} {label:8s} unchanged: private masters "
                        f"{rows[label]['private'][-1]:.3f} s, persisted master "
                        f"{rows[label]['persisted'][-1]:.3f} s  ({load_average()})",
                        flush=True,
                    )
            fixed.close()
    finally:
        if not args.base:
            shutil.rmtree(base, ignore_errors=True)
    med = statistics.median
    print(
        f"\nunchanged re-relay of 8 files, s, medians of {args.rounds} interleaved rounds "
        f"(mean load average {statistics.mean(loads):.2f} on {os.cpu_count()} cores):"
    )
    for label, r in rows.items():
        print(
            f"  {label:8s} private masters {med(r['private']):.3f} | persisted "
            f"{med(r['persisted']):.3f}"
        )
    if "baseline" in rows:
        for mode in ("private", "persisted"):
            ratio = med(rows["this"][mode]) / med(rows["baseline"][mode])
            print(f"  this / baseline, {mode}: {ratio:.2f}")
    floors = fixed.floors()
    print(
        f"  (floors: `ssh evalhost true` {floors['ssh_true_s']:.3f} s fresh login, "
        f"{floors['ssh_true_persisted_s']:.3f} s persisted master; `python -c pass` "
        f"{floors['python_s']:.3f} s)"
    )


if __name__ == "__main__":
    main()
