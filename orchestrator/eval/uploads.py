"""A job's files on its host: the prompts (a built-in set or a local file, content-addressed)
carried in the job start when small, else pushed verified; the workdir they go under."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from orchestrator.eval.prompt_sets import prompts_data
from orchestrator.inventory import HostSpec
from orchestrator.transport import bundle
from orchestrator.transport.hosts import Host
from remote.protocol import CARRY_MAX_BYTES


def carry_or_push(host: Host, data: bytes, remote: str, carry: list | None) -> None:
    """Get `data` to the file `remote` on the host (content-addressed by its caller). With a
    `carry` list and a small file, it travels inside the job start (appended there, see
    `remote.protocol.JOB_CARRY_KEY`): no round trip of its own. Otherwise one round trip
    looks for it (and for the bundle) and it is pushed unless there with this content."""
    sha = hashlib.sha256(data).hexdigest()
    if carry is not None and len(data) <= CARRY_MAX_BYTES:
        carry.append({"path": remote, "sha256": sha, "data": base64.b64encode(data).decode()})
    elif bundle.ensure_and_find(host, {remote: sha}).missing:
        host.put_bytes(data, remote)


def workdir_for(host: Host, carry: list | None = None, data: bytes = b"") -> str:
    """The host's workdir for a path the job start takes there. As the inventory gives it
    when the job start carries everything that path names (`carry` given, `data` small
    enough): a leading ``~`` is then the host's to expand (``job start`` does), and asking
    the host for its home first would cost a whole command. Expanded here otherwise (a file
    pushed on its own needs its real path)."""
    if carry is not None and len(data) <= CARRY_MAX_BYTES:
        return host.spec.workdir.rstrip("/") or "/"
    return host.workdir


def push_prompts(host: Host, prompts: str, carry: list | None = None) -> dict:
    """Put a built-in set or a local file on the host (content-addressed: `carry_or_push`);
    returns the spec's ``prompts`` entry."""
    given = prompts_data(prompts)
    remote = f"{workdir_for(host, carry, given.data)}/prompts/{given.carried_name}"
    carry_or_push(host, given.data, remote, carry)
    return given.entry(remote)


def resolve_prompts(
    host: Host, spec: HostSpec, prompts: str | None, carry: list | None = None
) -> dict:
    if prompts is None and spec.eval and spec.eval.prompts:
        prompts = "host:" + spec.eval.prompts
    if prompts is None:
        prompts = "chat"
    if prompts.startswith("host:"):
        path = host.expand(prompts[len("host:") :])
        return {"path": path, "name": Path(path).stem, "sha256": None, "source": prompts}
    return push_prompts(host, prompts, carry)
