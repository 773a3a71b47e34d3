"""Where does a relay's CPU go? CPU seconds per process and per machine for ``dflash relay``
and ``scp -3 -O`` of the same checkpoint, between the relay benchmarks' two loopback hosts.

    python benchmarks/relay_cpu.py                    # one 1 GiB file
    python benchmarks/relay_cpu.py --files 8 --size-mib 128 --rounds 2

On a box where both hosts, both ssh links and this machine share a few cores, the relay is
CPU-bound: its speed is the CPU it spends per byte. This samples ``/proc/PID/stat`` (user +
system time, threads included) of every process under this one and under each sshd server
every 20 ms, and sorts them by role: sshd and the remote command on each host, the local
ssh clients (dflash's ControlMaster per host, or scp's ssh children), dflash's controller
(the pump) and scp itself. Kernel threads (writeback, journal) are taken from a snapshot
before and after; ``/proc/stat`` gives the whole box's busy, softirq and iowait time. A
process ending between two samples loses at most its last 20 ms.

Prints per tool a table of CPU seconds per GiB moved, wall time and the load average.
Besides dflash and scp, two references run in the same rounds over plain ssh connections,
their clients joined by one 1 MiB pipe: ``ceiling``, ``cat`` on both hosts (no hash, no
write), and ``floor``, the least a relay that hashes on both ends and writes durably must do
(`common/relay_floor.py`; one file only). Two more tools measure a relay resumed at 50% of a
single-file checkpoint (per GiB of the whole file, so the two compare): ``dflash resume``,
after a relay cut there (its saved hash states used: no kept prefix hashed again), and
``dflash resume-copied``, after the first half was copied into the partial folder by hand
(both hosts hash the prefix).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

from common import BENCHMARKS
from common.measure import load_now, spread
from common.relay import MiB, RelayHosts, half_partial, killed_at_half, random_file, relay_hosts

from remote.relay.pipes import widen_pipe

TICK = os.sysconf("SC_CLK_TCK")
FLOOR = BENCHMARKS / "common" / "relay_floor.py"


def _stat(pid: int) -> tuple[int, str, float] | None:
    """(ppid, comm, CPU seconds) of `pid`, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode(errors="replace")
    except OSError:
        return None
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    rest = raw[raw.rindex(")") + 2 :].split()
    return int(rest[1]), comm, (int(rest[11]) + int(rest[12])) / TICK


def _syscalls(pid: int) -> int:
    """read- and write-like system calls of `pid` so far (/proc/PID/io), 0 if unknown."""
    try:
        with open(f"/proc/{pid}/io") as fh:
            fields = dict(line.split(": ") for line in fh.read().splitlines())
        return int(fields["syscr"]) + int(fields["syscw"])
    except (OSError, KeyError, ValueError):
        return 0


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(x) for x in fh.read().split()]
    except OSError:
        return []


def _kernel_threads() -> dict[int, float]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None and (st[0] == 2 or int(name) == 2):
                out[int(name)] = st[2]
    return out


def _proc_stat() -> list[int]:
    with open("/proc/stat") as fh:
        return [int(x) for x in fh.readline().split()[1:]]


class Sampler:
    """Last seen CPU seconds (and role) of every process under the given roots."""

    def __init__(self, roots: dict[int, str], classify):
        self.roots, self.classify = roots, classify
        # pid -> (role, CPU seconds, name, whether its command line was there to classify)
        self.seen: dict[int, tuple[str | None, float, str, bool]] = {}
        self.start: dict[int, float] = {}
        self.calls: dict[int, int] = {}  # last seen read/write system calls
        self.stop = threading.Event()

    def _walk(self) -> None:
        for root, side in self.roots.items():
            todo = [(root, side)]
            while todo:
                pid, side = todo.pop()
                st = _stat(pid)
                if st is None:
                    continue
                old = self.seen.get(pid)
                # classified again when its name changes (a wrapper that exec'd ssh), and
                # until its command line was there: mid-exec, /proc shows the new name
                # with an empty command line
                if old and old[2] == st[1] and old[3]:
                    role, named = old[0], True
                else:
                    named = bool(_cmdline(pid))
                    role = self.classify(pid, side, st[1])
                self.seen[pid] = (role, st[2], st[1], named)
                self.calls[pid] = _syscalls(pid) or self.calls.get(pid, 0)
                todo += [(c, side) for c in _children(pid) if c not in self.roots]

    def run(self) -> None:
        while not self.stop.wait(0.02):
            self._walk()

    def __enter__(self) -> Sampler:
        self._walk()
        self.start = {pid: cpu for pid, (_, cpu, _, _) in self.seen.items()}
        self.calls0 = dict(self.calls)
        self.k0, self.s0, self.t0 = _kernel_threads(), _proc_stat(), time.perf_counter()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.t0
        self.stop.set()
        self.thread.join()
        self._walk()
        k1, s1 = _kernel_threads(), _proc_stat()
        self.roles: dict[str, float] = defaultdict(float)
        self.role_calls: dict[str, int] = defaultdict(int)
        for pid, (role, cpu, _, _) in self.seen.items():
            if role is not None:
                self.roles[role] += cpu - self.start.get(pid, 0.0)
                self.role_calls[role] += self.calls.get(pid, 0) - self.calls0.get(pid, 0)
        self.roles["kernel threads"] = sum(v - self.k0.get(p, v) for p, v in k1.items())
        d = [b - a for a, b in zip(self.s0, s1, strict=False)]
        # user nice system idle iowait irq softirq steal
        self.box = {
            "busy": (d[0] + d[1] + d[2] + d[5] + d[6] + d[7]) / TICK,
            "softirq+irq": (d[5] + d[6]) / TICK,
            "iowait": d[4] / TICK,
        }


def classifier(h: RelayHosts):
    ports = {str(h.trainer.port): "src", str(h.evalhost.port): "dst"}

    def classify(pid: int, side: str, comm: str) -> str | None:
        if side in ("src", "dst"):  # under that host's sshd
            cmd = _cmdline(pid)
            if comm == "sshd":
                return None if pid in (h.trainer.proc.pid, h.evalhost.proc.pid) else f"sshd {side}"
            if "relay-send" in cmd:
                return "relay-send"
            if "relay-recv" in cmd or "relay-lock" in cmd:
                return "relay-recv"  # the lock holder receives a destination's first batch
            if comm in ("scp", "cat"):
                return f"{comm} remote {side}"
            if FLOOR.name in cmd:
                return f"floor remote {side}"
            return f"other {side} ({comm})"
        if pid == os.getpid():
            return None
        cmd = _cmdline(pid)
        if comm == "ssh" or cmd.startswith("ssh "):
            for port, which in ports.items():
                if f" {port} " in cmd or f"Port={port}" in cmd or f":{port}/" in cmd:
                    return f"ssh client {which}"
            return "ssh client ?"
        if "orchestrator" in cmd and "relay" in cmd:
            return "pump (controller)"
        if comm == "scp":
            return "scp local"
        return f"local {comm}"

    return classify


def machine(role: str) -> str | None:
    """Which of the three machines a role's process would run on with real hosts: the
    trainer (under its sshd), the eval host (under its), or the workstation (the rest)."""
    if role == "kernel threads":
        return None  # the whole box's: not one machine's
    if role.startswith(("ssh client", "pump", "scp local", "local ")):
        return "workstation"
    if role == "relay-send" or role.startswith("other src") or role.endswith(" src"):
        return "trainer"
    if role == "relay-recv" or role.startswith("other dst") or role.endswith(" dst"):
        return "eval host"
    return "workstation"


MACHINES = ("workstation", "trainer", "eval host")


def per_machine(s: Sampler) -> dict[str, float]:
    out = dict.fromkeys(MACHINES, 0.0)
    for role, cpu in s.roles.items():
        where = machine(role)
        if where:
            out[where] += cpu
    return out


def ssh_pair(h: RelayHosts, cipher: str, send: str, recv: str) -> tuple[str, str]:
    """``ssh trainer SEND | ssh evalhost RECV`` over plain connections, the two clients joined
    by one 1 MiB pipe (as dflash's pump joins its two); returns their stderr texts."""
    r, w = os.pipe()
    widen_pipe(w)
    a = subprocess.Popen(h.ssh_argv(h.trainer, cipher) + [send], stdout=w, stderr=subprocess.PIPE)
    b = subprocess.Popen(h.ssh_argv(h.evalhost, cipher) + [recv], stdin=r, stderr=subprocess.PIPE)
    os.close(r)
    os.close(w)
    out = a.stderr.read().decode().strip(), b.stderr.read().decode().strip()
    if b.wait() or a.wait():
        raise SystemExit(f"ssh {send!r} | ssh {recv!r} failed: {out[0][-200:]} {out[1][-200:]}")
    return out


def measure(h: RelayHosts, tool: str, name: str, cipher: str) -> Sampler:
    roots = {os.getpid(): "local", h.trainer.proc.pid: "src", h.evalhost.proc.pid: "dst"}
    src = h.ckpts / name
    with Sampler(roots, classifier(h)) as s:
        if tool.startswith("dflash"):
            proc = subprocess.run(h.cli(name), capture_output=True, text=True, env=h.env)
            if proc.returncode:
                raise SystemExit(proc.stderr[-400:])
        elif tool == "floor":
            py = f"{shlex.quote(sys.executable)} {shlex.quote(str(FLOOR))}"
            # into the scp folder: emptied before each round like dflash's drafters folder
            dst = h.evalhost.root / "scp" / name
            sent, got = ssh_pair(
                h,
                cipher,
                f"{py} send {shlex.quote(str(src))}",
                f"{py} recv {shlex.quote(str(dst))}",
            )
            if not sent or sent != got:
                raise SystemExit(f"the floor's two sha256 differ: {sent!r} {got!r}")
        elif tool == "ceiling":
            ssh_pair(h, cipher, f"cat {src}/*" if src.is_dir() else f"cat {src}", "cat > /dev/null")
        else:
            subprocess.run(
                h.scp_argv(cipher, True)
                + [
                    f"scp://127.0.0.1:{h.trainer.port}/{src}",
                    f"scp://127.0.0.1:{h.evalhost.port}/{h.evalhost.root / 'scp' / name}",
                ],
                check=True,
            )
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=1, help="files in the checkpoint")
    ap.add_argument("--size-mib", type=int, default=1024, help="MiB per file")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--cipher", default="aes128-gcm@openssh.com")
    ap.add_argument("--tools", default="dflash,scp -3 -O,floor,ceiling")
    ap.add_argument(
        "--fixed-mib",
        type=int,
        default=64,
        help="also move a file this size per tool and round: its CPU, taken from the big "
        "one's, leaves the cost per GiB beyond start-up (0: off)",
    )
    args = ap.parse_args()
    tools = args.tools.split(",")
    if args.files > 1 and "floor" in tools:
        print("(the floor moves one file: left out of this run)")
        tools.remove("floor")
    base = Path(tempfile.mkdtemp(prefix="dflash-relay-cpu-"))
    try:
        with relay_hosts(base, {"complete_rule": "marker"}) as h:
            size = args.size_mib * MiB
            if args.files == 1:
                name = "step_1.bin"
                random_file(h.ckpts / name, size)
                (h.ckpts / f"{name}.COMPLETE").write_bytes(b"")
            else:
                name = "step_1"
                for i in range(args.files):
                    random_file(h.ckpts / name / f"model-{i:05d}.safetensors", size)
                (h.ckpts / name / "COMPLETE").write_bytes(b"")
            total = size * args.files / (1 << 30)
            small = "step_0.bin"
            if args.fixed_mib:
                random_file(h.ckpts / small, args.fixed_mib * MiB)
                (h.ckpts / f"{small}.COMPLETE").write_bytes(b"")
            h.relay("--dry-run", name)  # installs the host bundle: untimed
            # per tool, one {machine: CPU-s} per round: the big relay's and the small one's
            big: dict[str, list[dict[str, float]]] = defaultdict(list)
            small_cpu: dict[str, list[dict[str, float]]] = defaultdict(list)
            for rnd in range(args.rounds):
                for tool in tools:
                    _clear(h)
                    if tool == "dflash resume":
                        killed_at_half(h, name, size)
                    elif tool == "dflash resume-copied":
                        half_partial(h, name)
                    os.sync()
                    s = measure(h, tool, name, args.cipher)
                    mib_s = total * 1024 / s.wall
                    print(
                        f"round {rnd + 1} {tool}: {s.wall:.2f} s, {mib_s:.1f} MiB/s ({load_now()})"
                    )
                    rows = sorted(s.roles.items(), key=lambda kv: -kv[1])
                    for role, cpu in rows:
                        if cpu >= 0.01:
                            calls = s.role_calls.get(role, 0) / total / 1000
                            print(
                                f"    {role:26s} {cpu / total:6.2f} CPU-s/GiB"
                                + (f"  {calls:7.1f}k read/write calls/GiB" if calls else "")
                            )
                    big[tool].append(per_machine(s))
                    if args.fixed_mib and not tool.startswith("dflash resume"):
                        _clear(h)
                        small_cpu[tool].append(per_machine(measure(h, tool, small, args.cipher)))
                    tracked = sum(s.roles.values())
                    print(
                        f"    {'= tracked':26s} {tracked / total:6.2f} CPU-s/GiB; whole box busy "
                        f"{s.box['busy'] / total:.2f} (softirq+irq "
                        f"{s.box['softirq+irq'] / total:.2f}), iowait "
                        f"{s.box['iowait'] / total:.2f}, wall {s.wall / total:.2f} s/GiB"
                    )
            whole = {t: [{m: c[m] / total for m in MACHINES} for c in rs] for t, rs in big.items()}
            print("per machine, CPU-s/GiB (mean over rounds):")
            print_machines(whole)
            if small_cpu:
                gib, small_gib = total, args.fixed_mib / 1024
                beyond = {
                    tool: [
                        {m: (b[m] - f[m]) / (gib - small_gib) for m in MACHINES}
                        for b, f in zip(big[tool], small_cpu[tool], strict=True)
                    ]
                    for tool in small_cpu
                }
                print(
                    f"per machine, CPU-s per GiB beyond start-up (a {args.fixed_mib} MiB "
                    "relay's CPU taken off):"
                )
                print_machines(beyond)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _clear(h: RelayHosts) -> None:
    """Empty both tools' destination folders (and sync), so each run writes anew."""
    shutil.rmtree(h.drafters, ignore_errors=True)
    shutil.rmtree(h.evalhost.root / "scp", ignore_errors=True)
    h.drafters.mkdir()
    (h.evalhost.root / "scp").mkdir()
    os.sync()


def print_machines(rounds: dict[str, list[dict[str, float]]]) -> None:
    """CPU-s per GiB per machine (mean over rounds), each tool against `scp -3 -O` and
    dflash against the floor: the workstation's and the busiest machine's, of the means and
    round by round (each round against the same round's), since scp's own figure moves
    from round to round."""
    means = {
        t: {m: statistics.fmean(r[m] for r in rs) for m in MACHINES} for t, rs in rounds.items()
    }
    for tool, cpu in means.items():
        cells = "  ".join(f"{m} {cpu[m]:.2f}" for m in MACHINES)
        print(f"    {tool:22s} {cells}  busiest {max(cpu.values()):.2f}")
    for base in ("scp -3 -O", "floor"):
        if base not in means:
            continue
        for tool in means:
            if tool != base and (base == "scp -3 -O" or tool.startswith("dflash")):
                _against(rounds, means, tool, base)


def _against(rounds: dict, means: dict, tool: str, base: str) -> None:
    """`tool`'s workstation and busiest machine against `base`'s: of the means, and the
    range of the rounds' own ratios where there are several."""
    a, b = means[tool], means[base]
    print(
        f"    {tool} / {base}: workstation {a['workstation'] / b['workstation']:.2f}x, "
        f"busiest machine {max(a.values()) / max(b.values()):.2f}x"
    )
    pairs = list(zip(rounds[tool], rounds[base], strict=True))
    if len(pairs) > 1:
        ws = [x["workstation"] / y["workstation"] for x, y in pairs]
        busiest = [max(x.values()) / max(y.values()) for x, y in pairs]
        print(f"      round by round: workstation {spread(ws)}, busiest machine {spread(busiest)}")


if __name__ == "__main__":
    main()
