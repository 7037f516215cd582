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

MAX_BYTES = 1 << 30  # a pickle larger than this is not read at all


class UnsafePickle(ValueError):
    """The pickle asked for something other than plain data."""


class _PlainData(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: D401 - pickle's hook
        raise UnsafePickle(f"refused global {module}.{name}: dumps hold plain data only")

    def persistent_load(self, pid):
        raise UnsafePickle("refused persistent id: dumps hold plain data only")


class _Reader:
    """The pickle's bytes behind only ``read`` and ``readline``.

    Given a stream with ``readinto`` (BytesIO has one), the C unpickler allocates whatever
    length an opcode claims before reading it: a 20-byte pickle claiming a 16 GiB bytes
    object would allocate 16 GiB. Through ``read`` it gets what is really there, and a
    short read is a truncated pickle.
    """

    def __init__(self, data: bytes):
        self._buffer = io.BytesIO(data)

    def read(self, n: int = -1) -> bytes:
        return self._buffer.read(n)

    def readline(self) -> bytes:
        return self._buffer.readline()


def loads(data: bytes):
    """Plain data from a pickle, or UnsafePickle / ValueError saying why not."""
    if len(data) > MAX_BYTES:
        raise ValueError(f"pickle larger than {MAX_BYTES >> 20} MiB")
    try:
        return _PlainData(_Reader(data)).load()
    except UnsafePickle:
        raise
    except (pickle.UnpicklingError, EOFError, IndexError, KeyError, TypeError, AttributeError,
            RecursionError, MemoryError, OverflowError, UnicodeDecodeError) as exc:
        raise ValueError(f"not a readable pickle: {type(exc).__name__}: {exc}"[:300]) from exc
