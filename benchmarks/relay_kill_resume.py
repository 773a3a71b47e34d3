"""Does a relay stopped at any byte resume to an identical checkpoint, leaving nothing behind?

    python benchmarks/relay_kill_resume.py                  # 24 kills, 3-file 48 MiB checkpoint
    python benchmarks/relay_kill_resume.py --kills 40 --size-scale 4 --seed 7

Starts the relay benchmarks' two loopback hosts (`common.relay`) and makes one multi-file
checkpoint of random bytes. Each round starts the real CLI (``python -m
orchestrator relay``), waits until the destination's partial folder holds a random number of
bytes (uniform over the checkpoint's size), then stops it one of four ways, in turn:
``kill -9`` of the controller, SIGTERM, SIGINT, or killing the eval host's sshd sessions
(a dropped link). After each stop it checks that nothing is published half (the final name
is absent or byte-identical), that every partial file is a prefix of its source once the
host-side writer has drained, that the exit code is the documented one (143 SIGTERM, 130
SIGINT, 1 dropped link), and that no ssh ControlMaster of that relay is left after 10 s.
Then it resumes with a second relay and checks the published checkpoint byte for byte
against the source, and removes it for the next round. Prints one line per round and a
summary; exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
from common import ROOT
from common.measure import load_now
from common.relay import MiB, relay_hosts, settle

MODES = ("kill -9", "SIGTERM", "SIGINT", "link drop")


def partial_bytes(folder: Path) -> int:
    """Bytes in every file under ``folder`` (0 while it is not there)."""
    try:
        return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    except OSError:
        return 0


def masters_of(pid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "-M" in cmd and any(f"dfr-{pid}-" in a for a in cmd):
            out.append(p)
    return out


def digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` but dflash's manifest, by relative path."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (folder.rglob("*") if folder.exists() else ())
        if p.is_file() and p.name != ".dflash-manifest.json"
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=24, help="rounds (random offsets), >= 20")
    ap.add_argument("--size-scale", type=float, default=1.0, help="scale the 48 MiB checkpoint")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)

    base = Path(tempfile.mkdtemp(prefix="dflash-kill-bench-"))
    failures: list[str] = []
    try:
        with relay_hosts(base) as h:
            run_rounds(h, args, rng, failures)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if failures:
        raise SystemExit(1)


def run_rounds(h, args, rng: random.Random, failures: list[str]) -> None:
    """Make the checkpoint, then stop and resume the relay `args.kills` times."""
    evalhost, env = h.evalhost, h.env
    ckpts, drafters = h.ckpts, h.drafters
    sizes = {
        "model-00001-of-00002.safetensors": 24,
        "model-00002-of-00002.safetensors": 20,
        "sub/optimizer.bin": 4,
    }
    src = ckpts / "step_5"
    for rel, mib in sizes.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(os.urandom(int(mib * MiB * args.size_scale)))
    (src / "COMPLETE").write_bytes(b"")
    want = digests(src)
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    cmd = h.cli("step_5")
    subprocess.run(cmd + ["--dry-run"], env=env, cwd=ROOT, capture_output=True)  # push
    partial, final = drafters / ".partial-step_5", drafters / "step_5"
    t0 = time.monotonic()
    for rnd in range(args.kills):
        mode = MODES[rnd % len(MODES)]
        target = rng.randrange(1, total)
        problems: list[str] = []
        proc = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        while proc.poll() is None and partial_bytes(partial) < target:
            time.sleep(0.002)
        at = partial_bytes(partial)
        if proc.poll() is None:
            if mode == "kill -9":
                proc.kill()
            elif mode == "SIGTERM":
                proc.send_signal(signal.SIGTERM)
            elif mode == "SIGINT":
                proc.send_signal(signal.SIGINT)
            else:
                evalhost.kill_sessions()
        _, err = proc.communicate(timeout=120)
        code = proc.returncode
        expected = {"kill -9": -9, "SIGTERM": 143, "SIGINT": 130, "link drop": 1}[mode]
        finished = code == 0  # it may finish before the stop lands
        if not finished and code != expected:
            problems.append(f"exit {code}, expected {expected}: {err.strip()[-200:]}")
        deadline = time.monotonic() + 10
        while masters_of(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if masters_of(proc.pid):
            problems.append("ssh masters left running")
        if final.exists():
            if digests(final) != want:
                problems.append("published checkpoint differs from the source")
        else:
            settle(partial, partial_bytes)
            for p in partial.rglob("*") if partial.exists() else []:
                if p.is_file() and not p.name.startswith(".dflash-"):
                    data = p.read_bytes()
                    if (src / p.relative_to(partial)).read_bytes()[: len(data)] != data:
                        problems.append(f"partial {p.name} is not a prefix of its source")
        resume = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        if resume.returncode != 0:
            problems.append(f"resume failed: {resume.stderr.strip()[-200:]}")
        how = ""
        try:  # how the resume went: bytes it read, kept prefixes hashed again
            rep = json.loads(resume.stdout)
            st = rep["checkpoints"][0]["destinations"]["evalhost"]
            how = (
                f", resume read {rep['bytes_read'] / MiB:.1f} MiB, "
                f"rehashed {st.get('prefix_hashed', 0) / MiB:.1f} MiB"
            )
        except (ValueError, KeyError, IndexError):
            pass
        if digests(final) != want:
            problems.append("resumed checkpoint differs from the source")
        print(
            f"round {rnd + 1:2d}: {mode:9s} at {at / MiB:6.1f}/{total / MiB:.1f} MiB "
            f"(exit {code}{how}) -> {'ok' if not problems else '; '.join(problems)}",
            flush=True,
        )
        failures += [f"round {rnd + 1}: {p}" for p in problems]
        shutil.rmtree(final, ignore_errors=True)
        shutil.rmtree(partial, ignore_errors=True)
    print(
        f"\n{args.kills} stops at random offsets, {len(failures)} failed checks, "
        f"{time.monotonic() - t0:.0f} s ({load_now()})"
    )


if __name__ == "__main__":
    main()
