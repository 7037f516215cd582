"""A restricted unpickler for dumps from machines we don't trust.

Flight-recorder dumps and CUDA memory snapshots are pickles of plain containers and
scalars. ``load`` admits exactly that: every global (a class, a function, ``os.system``,
``builtins.eval``) is refused, so no ``__reduce__`` trick can run code, and the size of
what is built is bounded so a crafted pickle can't exhaust memory.

A real flight-recorder dump (PyTorch 2.11) opens with ``\\x80\\x04\\x95`` and holds only
dicts, lists, tuples, strings, numbers, booleans and None.
"""

from __future__ import annotations

import io
import pickle
import struct

MAX_BYTES = 1 << 30  # a pickle larger than this is not read at all


class UnsafePickle(ValueError):
    """The pickle asked for something other than plain data."""


class _PlainData(pickle._Unpickler):  # noqa: SLF001 - the pure-Python unpickler, on purpose (below)
    """Plain data only, and never more memory than the pickle's own bytes.

    The C unpickler allocates whatever length an opcode claims before it reads it (a 20-byte
    pickle claiming a 16 GiB bytes object allocates 16 GiB, from ``pickle.loads`` too). This
    one reads through ``BytesIO.read``, which returns only what is really there, so a claim is
    never allocated, and a claim longer than what is left is a truncated pickle.
    """

    def find_class(self, module: str, name: str):  # noqa: D401 - pickle's hook
        raise UnsafePickle(f"refused global {module}.{name}: dumps hold plain data only")

    def persistent_load(self, pid):
        raise UnsafePickle("refused persistent id: dumps hold plain data only")

    dispatch = dict(pickle._Unpickler.dispatch)  # noqa: SLF001
    # bytearray8 allocates its claimed length before reading it; dumps never hold one
    dispatch[pickle.BYTEARRAY8[0]] = lambda self: self._refuse("bytearray")  # noqa: SLF001

    def _refuse(self, what: str):
        raise UnsafePickle(f"refused {what}: dumps hold plain data only")


class _Exact(io.BytesIO):
    """The pickle's bytes; a read of n bytes gets n or fails (BytesIO itself never allocates
    more than is there, so a claimed length costs nothing)."""

    def read(self, n: int | None = -1) -> bytes:
        data = super().read(n)
        if n is not None and 0 <= n != len(data):
            raise pickle.UnpicklingError("pickle data was truncated")
        return data


def loads(data: bytes):
    """Plain data from a pickle, or UnsafePickle / ValueError saying why not."""
    if len(data) > MAX_BYTES:
        raise ValueError(f"pickle larger than {MAX_BYTES >> 20} MiB")
    try:
        return _PlainData(_Exact(data)).load()
    except UnsafePickle:
        raise
    except (pickle.UnpicklingError, EOFError, IndexError, KeyError, TypeError, AttributeError, ValueError,
            RecursionError, MemoryError, OverflowError, UnicodeDecodeError, struct.error) as exc:
        raise ValueError(f"not a readable pickle: {type(exc).__name__}: {exc}"[:300]) from exc
