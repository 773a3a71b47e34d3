"""A sha256 whose state saves and restores (OpenSSL via ctypes), for resume."""

from __future__ import annotations

import hashlib
import os
import struct

GRID = 16 * 1024 * 1024  # both hosts record a file's hash state every GRID bytes
STATE_SIZE = 112
_BUFFER = 256  # larger than the struct, so a bigger one fails the self-test

_lib: object = None  # False: unavailable; None: not looked up


def _candidates() -> list[str]:
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
    import ctypes

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
        data = bytes(range(256)) * 41 + b"x"
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
    global _lib
    if _lib is None:
        _lib = _load()
    return bool(_lib)


def state_problem(state: bytes, length: int) -> str | None:
    """Why `state` is not the state after `length` bytes (its own counts), or None."""
    if not isinstance(state, bytes) or len(state) != STATE_SIZE:
        return "is not a sha256 state"
    nl, nh = struct.unpack_from("=II", state, 32)
    num, md_len = struct.unpack_from("=II", state, 104)
    if (nh << 32 | nl) != length * 8 or num != length % 64 or md_len != 32:
        return f"is not the state after {length} bytes"
    return None


class Sha256:
    """hashlib's sha256 plus `state` / `resume`."""

    def __init__(self):
        if not available():
            raise RuntimeError("resumable sha256 is not available here")
        import ctypes

        self._ctx = ctypes.create_string_buffer(_BUFFER)
        self.length = 0
        _lib[0](self._ctx)

    @classmethod
    def resume(cls, state: bytes, length: int) -> Sha256 | None:
        """The hash after `length` bytes from `state`, or None."""
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
                del block
        self.length += n

    def state(self) -> bytes:
        return self._ctx.raw[:STATE_SIZE]

    def hexdigest(self) -> str:
        import ctypes

        ctx = ctypes.create_string_buffer(self._ctx.raw, _BUFFER)
        out = ctypes.create_string_buffer(32)
        _lib[2](out, ctx)
        return out.raw.hex()


def new(state: bytes | None = None, length: int = 0):
    """A resumable sha256 (from `state` when given, None if refused), else hashlib's."""
    if state is not None:
        return Sha256.resume(state, length)
    return Sha256() if available() else hashlib.sha256()
