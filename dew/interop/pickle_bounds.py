"""Bounds on what unpickling a file may build, by the file's size: a small hostile pickle must not
take gigabytes of memory, recurse without end or hand a reader a structure that expands
exponentially when it is walked.

- ``check_opcodes``: one pickle's opcodes are read first (nothing built) and a memo index larger
  than the opcodes so far is refused: CPython's unpickler sizes its memo array by the largest
  index, so 9 bytes could otherwise ask for gigabytes;
- ``Bounds.charge`` (through ``charge`` while ``active``): the bytes of the arrays built, checked
  before each is allocated, against a multiple of the file's size;
- ``check_graph``: the object graph loaded, walked as a reader walks it (shared references counted
  at each use), refused when it contains itself, nests too deep or expands to more objects than
  the file could describe.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import pickle
import pickletools
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO


class PickleRefused(pickle.UnpicklingError):
    """A pickle asking for a global (or a construct) that is not part of an NVlabs/edm network."""


@dataclasses.dataclass
class Bounds:
    """What reading a pickle of ``size`` bytes may build: array bytes (``array_bytes``: every
    storage and tensor copy; a network pickle holds each tensor's bytes once, a bfloat16 one
    widened to float32), objects as a reader walks them (``objects``, shared references counted
    at each use) and nesting ``depth``."""

    size: int
    built: int = 0

    ARRAY_FACTOR = 8  # storage + tensor copy, bfloat16 widened: at most ~5x the file's bytes
    SLACK = 1 << 20  # a tiny file may still build a few small arrays
    DEPTH = 64  # a network's record nests ~10 deep (modules, their state, argument lists)

    @property
    def array_bytes(self) -> int:
        return self.ARRAY_FACTOR * self.size + self.SLACK

    @property
    def objects(self) -> int:
        return self.size + 10_000

    def charge(self, nbytes: int, what: str) -> None:
        """Count ``nbytes`` about to be allocated for ``what``; refuse past ``array_bytes``."""
        if self.built + nbytes > self.array_bytes:
            raise PickleRefused(
                f"{what} would bring the arrays built to {self.built + nbytes} bytes, more than a "
                f"{self.size}-byte pickle can hold (at most {self.array_bytes})"
            )
        self.built += nbytes


_BOUNDS: contextvars.ContextVar[Bounds | None] = contextvars.ContextVar("pickle_bounds", default=None)


def charge(nbytes: int, what: str) -> None:
    bounds = _BOUNDS.get()
    if bounds is not None:
        bounds.charge(nbytes, what)


_MEMO_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}


def check_opcodes(file: BinaryIO, what: str = "the pickle") -> None:
    """Read one pickle's opcodes from ``file`` (up to its STOP) without building anything, and
    return to where it started; refuse a memo index larger than the opcodes read so far (the
    unpickler would size its memo by it: 9 bytes could ask for gigabytes) or a stream that is
    not a pickle."""
    start = file.tell()
    try:
        for count, (opcode, arg, _pos) in enumerate(pickletools.genops(file)):
            if opcode.name in _MEMO_PUTS and not (isinstance(arg, int) and 0 <= arg <= count):
                raise PickleRefused(
                    f"{what}: memo index {arg!r} after {count} opcodes (a pickler numbers them in order)"
                )
    except PickleRefused:
        raise
    except Exception as e:  # truncated or not a pickle: the unpickler says what, bounded
        raise pickle.UnpicklingError(f"{type(e).__name__}: {str(e)[:200]}") from None
    finally:
        file.seek(start)


def _path_text(path: tuple) -> str:
    """``('ema', '_init_kwargs', 'x', 0)`` as ``ema._init_kwargs.x[0]``."""
    text = ""
    for step in path:
        if isinstance(step, str) and step.isidentifier():
            text += f".{step}" if text else step
        else:
            text += f"[{step!r}]"
    return text or "the top object"


def check_graph(
    top: Any, bounds: Bounds, name: str = "the pickle", expand: Callable[[Any], list | None] | None = None
) -> None:
    """Walk what a pickle loaded as a reader of the record would (dicts, lists, tuples, and what
    ``expand`` gives as ``(key, item)`` pairs for other objects; arrays, strings and numbers are
    leaves), every shared reference at each use; refuse
    a container that contains itself, nesting deeper than ``bounds.DEPTH`` or more than
    ``bounds.objects`` objects, naming where."""
    visited = 0
    stack: list[tuple[Any, tuple, frozenset]] = [(top, (), frozenset())]
    while stack:
        value, path, ancestors = stack.pop()
        visited += 1
        if visited > bounds.objects:
            raise PickleRefused(
                f"{name}: its objects expand to more than {bounds.objects} as they are read (shared "
                f"references reused at {_path_text(path)}), more than a {bounds.size}-byte network "
                "pickle describes"
            )
        items: Any = expand(value) if expand is not None else None
        if items is None and isinstance(value, dict):
            items = list(value.items())
        elif items is None and isinstance(value, list | tuple):
            items = list(enumerate(value))
        if items is None:
            continue
        if id(value) in ancestors:
            raise PickleRefused(
                f"{name}: {_path_text(path)} refers back to a {type(value).__name__} that contains it "
                "(a self-referencing record; a network's record never is)"
            )
        if len(path) >= bounds.DEPTH:
            raise PickleRefused(f"{name}: nested deeper than {bounds.DEPTH} levels at {_path_text(path)}")
        inner = ancestors | {id(value)}
        for key, item in reversed(items):
            step = key if isinstance(key, str | int) else repr(key)[:40]
            stack.append((item, (*path, step), inner))


@contextlib.contextmanager
def active(bounds: Bounds) -> Iterator[Bounds]:
    """``charge`` counts against ``bounds`` inside the block (an unpickler's ``load``)."""
    token = _BOUNDS.set(bounds)
    try:
        yield bounds
    finally:
        _BOUNDS.reset(token)


__all__ = ["Bounds", "PickleRefused", "active", "charge", "check_graph", "check_opcodes"]
