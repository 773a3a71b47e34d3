"""The eval host's cache of target features: ``<workdir>/features/<key>.safetensors``.

What step 1 of the walk computes (`remote.eval.walk`: the target's features at the
drafter's layers and its greedy tokens) depends on the target, not on the drafter: every
checkpoint of a training run evaluated on the same ground truth asks for the same tensors.
An eval job keeps them here, one file per sample, and the next eval of another checkpoint
reads them back instead of running the target. Beside them, ``<key>.costs.json`` keeps the
target's part of one round's costs (`remote.eval.costs`), which depends on the target and
the host alone: an eval that finds every sample's entry (`RunCache.holds`, headers only)
and those costs loads the target's embedding and head, never its layers.

An entry's name hashes its key: the target's identity (`groundtruth.target_identity`,
plus its weight files' modification times), the drafter's layer ids, the dtype, the
device (and its card), the attention implementation, on a CPU torch's threads, kernel
instruction set and the CPU model, the torch and transformers versions, and the sample's
exact prompt and completion ids. The file holds the two tensors (``features``
[T, layers x hidden] in the engine's dtype, ``greedy`` [T - P + 1]) and, in its
safetensors metadata, the whole key and a sha256 of the tensors' bytes; a sampled eval's
entries (``final`` in the key) add the final hidden rows the head reads (``final``
[T - P + 1, hidden]: the target's distribution at every temperature). It is written from
the tensors' memory and read straight into new tensors (`feature_file`), so a long
sample's features are never held twice. An entry is used
only when its key, shapes, dtypes and digest all match; anything else (a torn, corrupt,
foreign or mismatched file) is a miss, recomputed and replaced, never trusted.

Writes go to a unique temp name (``O_EXCL | O_NOFOLLOW``, in the folder held open as a
descriptor) and are renamed into place, so a reader sees a whole entry or none, and two
evals on one host at once never share a temp file; reads open with ``O_NOFOLLOW``, so a
symlink planted in the folder is a miss, and a symlinked folder disables the cache for
the run (one warning). The folder is bounded by the job's ``feature_cache_gib``
(`remote.protocol.JobSpec.feature_cache_bytes`): before an entry is renamed in, the least
recently used entries (by modification time, refreshed on every hit) are removed under a
``flock`` until it fits. Entries this run used or wrote are never evicted for its own
(an eval larger than the bound keeps the first samples that fit, instead of evicting its
own and missing everything next time). A cache that cannot be written (a full disk) only
costs the run its reuse: the eval goes on.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from remote.eval import feature_file
from remote.eval.feature_file import tensor_digest
from remote.relay.fdfiles import write_all

FOLDER = "features"
SUFFIX = ".safetensors"
COSTS_SUFFIX = ".costs.json"  # the target's round costs (`RunCache.lookup_costs`)
COSTS_MOST_BYTES = 2**16  # a costs entry is a few hundred bytes: a larger file is no entry
META_KEY = "dflash.feature_cache"
LOCK_NAME = ".lock"
TMP_PREFIX = ".tmp-"
STALE_TMP_SECONDS = 3600  # a temp file this old is a killed writer's: removed by a scan
RESERVE_BYTES = 2**30  # free disk an entry never takes


def _sha256_ids(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()


def context_key(context: dict) -> str:
    return hashlib.sha256(json.dumps(context, sort_keys=True).encode()).hexdigest()[:24]


@dataclass
class FeatureCache:
    """The cache folder `root` (created when missing) bounded by `limit` bytes."""

    root: Path
    limit: int

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    @classmethod
    def for_job(cls, workdir: str, limit: int) -> FeatureCache | None:
        """The cache of a job in `workdir` bounded by `limit` bytes (0: none, the job
        turned it off)."""
        if limit <= 0:
            return None
        return cls(Path(os.path.expanduser(workdir)) / FOLDER, limit)

    def open(self, context: dict, width: int, hidden: int = 0) -> RunCache | str:
        """This run's view of the cache (`RunCache`) for entries of `context` whose
        features are `width` wide (`hidden`: the final rows' width, for entries that keep
        them: a sampled eval's); a warning line instead when the folder cannot be used."""
        try:
            self.root.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(self.root, 0o755)
            except FileExistsError:
                pass
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            why = (
                "it is a symlink"
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and self.root.is_symlink()
                else (exc.strerror or str(exc)).lower()
            )
            return f"the feature cache {self.root} is not used for this eval: {why}"
        key = context_key(context)
        return RunCache(fd, str(self.root), self.limit, context, key, width, hidden, hidden > 0)


@dataclass
class RunCache:
    """One eval's use of the cache folder (held open as `fd`): `lookup`, `store`, and the
    counts the result records (`summary`). Close with `close`."""

    fd: int
    where: str
    limit: int
    context: dict
    key: str
    width: int
    hidden: int = 0
    final: bool = False  # entries also hold the final hidden rows (a sampled eval)
    mine: set[str] = field(default_factory=set)  # entries this run used or wrote
    hits: int = 0
    stored: int = 0
    not_stored: int = 0
    warnings: list[str] = field(default_factory=list)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # ---- entries ------------------------------------------------------------------------

    def entry_meta(self, prompt: list[int], completion: list[int]) -> dict:
        meta = {
            "context": self.context,
            "prompt_tokens": len(prompt),
            "tokens": len(prompt) + len(completion),
            "prompt_sha256": _sha256_ids(prompt),
            "completion_sha256": _sha256_ids(completion),
        }
        if self.final:
            meta["final"] = True
        return meta

    def name(self, meta: dict) -> str:
        digest = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()
        return digest[:40] + SUFFIX

    def lookup(
        self, prompt: list[int], completion: list[int], dtype: torch.dtype
    ) -> tuple[torch.Tensor, ...] | None:
        """The sample's (features, greedy[, final]) from its entry, on the CPU, when it is
        whole and its key matches; None otherwise (its LRU time refreshed on a hit)."""
        meta = self.entry_meta(prompt, completion)
        name = self.name(meta)
        got = self._read(name, meta, dtype)
        if got is None:
            return None
        try:  # the most recently used now
            os.utime(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            pass
        self.mine.add(name)
        self.hits += 1
        return got

    def holds(self, prompt: list[int], completion: list[int]) -> bool:
        """Whether the sample's entry is there with its key: its header only, read before
        the target is loaded (`lookup` still checks the whole entry when it is used)."""
        meta = self.entry_meta(prompt, completion)
        with self._open(self.name(meta)) as fh:
            head = feature_file.header(fh) if fh is not None else None
        return head is not None and _stored_doc(head, meta) is not None

    def _open(self, name: str):
        """The entry `name` opened for reading without following a symlink (a context
        manager; its file is None when it cannot be opened)."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.fd)
        except OSError:
            return contextlib.nullcontext(None)
        return os.fdopen(fd, "rb")

    def _bytes(self, name: str, most: int) -> bytes | None:
        """The entry `name`'s bytes; None when it cannot be read or is larger than `most`
        bytes (a file grown past what its key allows is no entry: never read)."""
        try:
            with self._open(name) as fh:
                if fh is None or os.fstat(fh.fileno()).st_size > most:
                    return None
                return fh.read(most)
        except OSError:
            return None

    def _read(self, name: str, meta: dict, dtype: torch.dtype) -> tuple[torch.Tensor, ...] | None:
        """The entry's tensors (`feature_file.read`: each read into its own memory, the
        file exactly the size its key allows) when its key and digest match: (features,
        greedy) and, for a sampled eval, the final hidden rows."""
        T, P = meta["tokens"], meta["prompt_tokens"]
        shapes = {"features": ((T, self.width), dtype), "greedy": ((T - P + 1,), torch.long)}
        if self.final:
            shapes["final"] = ((T - P + 1, self.hidden), dtype)
        try:
            with self._open(name) as fh:
                head = feature_file.header(fh) if fh is not None else None
                stored = _stored_doc(head, meta) if head is not None else None
                if stored is None:
                    return None
                got = feature_file.read(fh, head, shapes, os.fstat(fh.fileno()).st_size)
        except OSError:  # a torn or vanished file: a miss, never the eval's failure
            return None
        if got is None:
            return None
        tensors = tuple(got[k] for k in shapes)
        return tensors if tensor_digest(*tensors) == stored["sha256"] else None

    def store(self, prompt: list[int], completion: list[int], *tensors: torch.Tensor) -> None:
        """Keep the sample's (features, greedy[, final]) as its entry, if it fits the bound
        once entries older than this run are evicted; a write that fails is a warning. The
        tensors' bytes go to the file from their own memory (`feature_file.parts`)."""
        meta = self.entry_meta(prompt, completion)
        got = [t.detach().cpu().contiguous() for t in tensors]
        doc = json.dumps({"key": meta, "sha256": tensor_digest(*got)})
        named = dict(zip(("features", "greedy", "final"), got, strict=False))
        self._put(self.name(meta), feature_file.parts(named, {META_KEY: doc}))

    # ---- the target's round costs -------------------------------------------------------

    def costs_key(self, inputs: dict) -> dict:
        return {"context": self.context, "round_costs": inputs}

    def costs_name(self, inputs: dict) -> str:
        digest = hashlib.sha256(json.dumps(self.costs_key(inputs), sort_keys=True).encode())
        return digest.hexdigest()[:40] + COSTS_SUFFIX

    def lookup_costs(self, inputs: dict) -> dict | None:
        """The target's round costs (`remote.protocol.TARGET_COSTS`) an eval of this
        context measured on `inputs` (`remote.eval.costs.CostInputs.key`), when its entry
        is there with its key and every figure is a positive number; None otherwise."""
        from remote.eval.costs import valid_target_costs

        name = self.costs_name(inputs)
        data = self._bytes(name, most=COSTS_MOST_BYTES)
        try:
            doc = json.loads(data) if data is not None else None
        except ValueError:
            return None
        if not isinstance(doc, dict) or doc.get("key") != self.costs_key(inputs):
            return None
        got = valid_target_costs(doc.get("costs"))
        if got is not None:
            self.mine.add(name)
        return got

    def store_costs(self, inputs: dict, target_costs: dict) -> None:
        """Keep the target's round costs measured on `inputs`, beside the features."""
        data = json.dumps({"key": self.costs_key(inputs), "costs": target_costs}).encode()
        self._put(self.costs_name(inputs), data, counted=False)

    # ---- writing an entry ---------------------------------------------------------------

    def _put(self, name: str, data: bytes | list, counted: bool = True) -> None:
        """Write `data` (bytes, or buffers written in turn) as the entry `name`: to a temp
        file, then renamed in once it fits the bound (`_make_room`); an entry that does
        not fit, or a write that fails (one warning), is counted as not stored when
        `counted`."""
        tmp = f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        parts = [data] if isinstance(data, bytes) else data
        try:
            wfd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=self.fd
            )
            try:
                for part in parts:
                    write_all(wfd, part)
            finally:
                os.close(wfd)
            with self._locked():
                if not self._make_room(sum(memoryview(p).nbytes for p in parts)):
                    self.not_stored += counted
                    return
                os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            self.mine.add(name)
            self.stored += counted
        except OSError as exc:
            self.not_stored += counted
            if not self.warnings:
                self.warnings.append(
                    f"the feature cache {self.where} could not keep an entry "
                    f"({(exc.strerror or str(exc)).lower()}); the eval goes on without it"
                )
        finally:
            try:
                os.unlink(tmp, dir_fd=self.fd)
            except OSError:
                pass

    # ---- the bound ----------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(LOCK_NAME, flags, 0o644, dir_fd=self.fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the lock

    def entries(self) -> list[tuple[int, int, str]]:
        """(mtime_ns, bytes, name) of every entry, oldest first; temp files a killed
        writer left are removed on the way."""
        out = []
        now = time.time_ns()
        for name in os.listdir(self.fd):
            try:
                st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            except OSError:
                continue
            if name.startswith(TMP_PREFIX):
                if now - st.st_mtime_ns > STALE_TMP_SECONDS * 10**9:
                    _unlink(self.fd, name)
                continue
            if name.endswith((SUFFIX, COSTS_SUFFIX)):
                out.append((st.st_mtime_ns, st.st_size, name))
        return sorted(out)

    def _make_room(self, size: int) -> bool:
        """Evict the least recently used entries this run did not use or write until `size`
        more bytes fit the bound and leave `RESERVE_BYTES` of the disk free; False when
        they cannot."""
        entries = self.entries()
        held = sum(s for _t, s, _n in entries)
        for _mtime, s, name in entries:
            if held + size <= self.limit:
                break
            if name not in self.mine:  # this run's own are kept: the new one is dropped
                _unlink(self.fd, name)
                held -= s
        if held + size > self.limit:
            return False
        vfs = os.statvfs(self.fd)
        return vfs.f_bavail * vfs.f_frsize >= size + RESERVE_BYTES

    def summary(self, samples: int) -> dict[str, Any]:
        """What the result records (``inputs.target_features``; the engine adds
        ``target_loaded``)."""
        return {
            "cached": self.hits == samples > 0,
            "cache_key": self.key,
            "samples_cached": self.hits,
            "samples_stored": self.stored,
            "samples_not_stored": self.not_stored,
        }


def _stored_doc(head: bytes, meta: dict) -> dict | None:
    """The entry's own record (its key and digest) from its safetensors header `head`,
    when the key is `meta`; None for any other, torn or foreign file."""
    stored = feature_file.metadata(head, META_KEY)
    if stored is None or stored.get("key") != meta:
        return None
    return stored if isinstance(stored.get("sha256"), str) else None


def _unlink(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
