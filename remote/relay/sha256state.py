"""A sha256 whose running state can be saved and restored (stdlib only: ctypes).

A resumed relay must still publish the sha256 of the WHOLE file, and hashlib cannot save
a hash mid-stream, so each host used to hash the kept prefix again on every resume. This
module drives the same OpenSSL that Python's own ``_hashlib`` links (its SHA256_Init /
SHA256_Update / SHA256_Final, the same SHA-NI code hashlib runs) on a ``SHA256_CTX``
buffer whose 112 bytes are the state: `Sha256.state` saves them, `Sha256.resume` restores
them. ctypes releases the GIL during each call, so other threads go on meanwhile.

`available()` says whether this works here: the library is found (the one ``_hashlib``
loaded, read from /proc/self/maps, else by its usual names), its symbols exist, and a
self-test (a digest split and restored mid-stream equals hashlib's) passes. Where it does
not, callers keep the old path (hash the prefix again); nothing fails.

`GRID` is where the relay records states: every GRID bytes of a file, on both hosts, so a
resume offset chosen on the grid has a state on each side.
"""

from __future__ import annotations

import hashlib
import os
import struct

GRID = 16 * 1024 * 1024  # a relay records a file's hash state every GRID bytes
STATE_SIZE = 112  # sizeof(SHA256_CTX) in OpenSSL 1.1 and 3.x: h[8], Nl, Nh, data[16], num, md_len
_BUFFER = 256  # room for the struct (larger than it, so a bigger one fails the self-test)

_lib: object = None  # the loaded functions, False when unavailable, None before the first look


def _candidates() -> list[str]:
    """Paths or names of libcrypto to try: first the one ``_hashlib`` has loaded."""
    out: list[str] = []
    try:
        import _hashlib  # noqa: F401  (loads libcrypto into this process)

        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.split(maxsplit=5)[-1].strip()
                if "/libcrypto" in path and path not in out and os.path.isfile(path):
                    out.append(path)
    except (ImportError, OSError):
        pass
    out += ["libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.dylib"]
    return out


def _load():
    import ctypes  # here, not at import: 10-15 ms that host commands without hashing skip

    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
            init, update, final = lib.SHA256_Init, lib.SHA256_Update, lib.SHA256_Final
        except (OSError, AttributeError):
            continue
        init.argtypes = [ctypes.c_void_p]
        update.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        final.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        for fn in (init, update, final):
            fn.restype = ctypes.c_int
        funcs = (init, update, final)
        if _self_test(funcs):
            return funcs
    return False


def _self_test(funcs) -> bool:
    global _lib
    saved, _lib = _lib, funcs
    try:
        data = bytes(range(256)) * 41 + b"x"  # not a multiple of the 64-byte block
        for cut in (0, 1, 63, 64, 65, 4096, len(data)):
            h = Sha256()
            h.update(data[:cut])
            again = Sha256.resume(h.state(), cut)
            if again is None:
                return False
            again.update(bytearray(data[cut:]))
            if again.hexdigest() != hashlib.sha256(data).hexdigest():
                return False
        return True
    except Exception:
        return False
    finally:
        _lib = saved


def available() -> bool:
    """Whether resumable hashing works on this host (looked up once)."""
    global _lib
    if _lib is None:
        _lib = _load()
    return bool(_lib)


def state_problem(state: bytes, length: int) -> str | None:
    """Why `state` cannot be the state after `length` bytes, or None. Checks what the
    struct says about itself: the bit count, the bytes in its block buffer, the digest
    length; a state copied from another offset or made up is refused."""
    if not isinstance(state, bytes) or len(state) != STATE_SIZE:
        return "is not a sha256 state"
    nl, nh = struct.unpack_from("=II", state, 32)
    num, md_len = struct.unpack_from("=II", state, 104)
    if (nh << 32 | nl) != length * 8 or num != length % 64 or md_len != 32:
        return f"is not the state after {length} bytes"
    return None


class Sha256:
    """A sha256 like hashlib's (`update`, `hexdigest`) plus `state` / `resume`; only
    where `available()`."""

    def __init__(self):
        if not available():
            raise RuntimeError("resumable sha256 is not available here")
        import ctypes

        self._ctx = ctypes.create_string_buffer(_BUFFER)
        self.length = 0
        _lib[0](self._ctx)

    @classmethod
    def resume(cls, state: bytes, length: int) -> Sha256 | None:
        """The hash after `length` bytes whose state is `state`; None when `state` is not
        one (`state_problem`) or this host cannot resume hashes."""
        if not available() or state_problem(state, length) is not None:
            return None
        import ctypes

        h = cls.__new__(cls)
        h._ctx = ctypes.create_string_buffer(_BUFFER)
        ctypes.memmove(h._ctx, state, STATE_SIZE)
        h.length = length
        return h

    def update(self, data) -> None:
        import ctypes

        view = memoryview(data).cast("B")
        n = len(view)
        if not n:
            return
        if view.readonly:
            block = data if isinstance(data, bytes) else view.tobytes()
            _lib[1](self._ctx, block, n)
        else:
            block = (ctypes.c_char * n).from_buffer(view)
            try:
                _lib[1](self._ctx, block, n)
            finally:
                del block  # releases the export of `data`'s buffer at once
        self.length += n

    def state(self) -> bytes:
        """The state after `length` bytes (`STATE_SIZE` bytes), for `resume`."""
        return self._ctx.raw[:STATE_SIZE]

    def hexdigest(self) -> str:
        """The digest of everything so far; the hash can go on after."""
        import ctypes

        ctx = ctypes.create_string_buffer(self._ctx.raw, _BUFFER)
        out = ctypes.create_string_buffer(32)
        _lib[2](out, ctx)
        return out.raw.hex()


def new(state: bytes | None = None, length: int = 0):
    """A resumable sha256 where this host has one (from `state` after `length` bytes when
    given; None if that state is refused), else hashlib's (only without `state`)."""
    if state is not None:
        return Sha256.resume(state, length)
    return Sha256() if available() else hashlib.sha256()
