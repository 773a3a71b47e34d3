"""Naming a thing by part of its id, one way for every command: a result run
(`results show RUN`), a host's job (`jobs attach JOB`)."""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.errors import DflashError


def resolve_id(ident: str, ids: Iterable[str], *, what: str, where: str, listed_by: str) -> str:
    """`ident` if it is one of `ids`; else the one id it begins, else the one holding it;
    none or several is a one-line error."""
    ids = sorted(set(ids))
    if ident in ids:
        return ident
    hits = [i for i in ids if i.startswith(ident)] or [i for i in ids if ident in i]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise DflashError(f"no {what} {ident!r} {where} ({listed_by} shows them)")
    raise DflashError(
        f"{ident!r} matches {len(hits)} {what}s {where}: {', '.join(hits)}; give more of the id"
    )
