"""Immutable collections with O(log₃₂ n) updates by structural sharing: :class:`FrozenMap`, :class:`FrozenVector`.

The folded run state (:mod:`reel.shared.core.run.state`) keeps its per-step and per-branch maps
in a :class:`FrozenMap` and an agent's turns in a :class:`FrozenVector`: callers read
them like a ``dict`` / a ``tuple`` but cannot change them, and the fold derives the
collection of the next commit from the previous one without copying it.

* The entries live in an ``immutables.Map`` (a hash array mapped trie, the structure
  behind :mod:`contextvars`): an update copies only the path to one leaf.
* Insertion order — what a ``dict`` would iterate, and what the state's JSON shows —
  is an append-only key log shared by every version: a map reads only the first ``n``
  keys, a later version appends beyond them. A version that finds the log already
  extended past its own ``n`` (another version of the same map grew it: two futures of
  one state) forks it first, so no published map ever sees a key it does not hold. The
  log is kept in chunks of :data:`CHUNK` keys, so such a fork shares the full chunks and
  copies O(n / CHUNK + CHUNK) references, not n. Keys are never removed, which is all
  the fold needs.

* A :class:`FrozenVector` is an ``immutables.Map`` from position to item: append and
  replace are one trie path each.

msgspec does not know these types: encode a Struct holding one with :func:`enc_hook`
(a ``FrozenMap`` becomes the JSON object its ``dict`` would give, in the same order; a
``FrozenVector`` the JSON array of its items) and decode with a ``dec_hook`` built on
:func:`from_builtins` / :meth:`FrozenVector.of`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import chain, islice
from typing import Any, Generic, TypeVar, overload

import immutables

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


CHUNK = 64
"""Keys per chunk of a key log."""


class _KeyLog(Generic[K]):
    """The append-only key log shared by the versions of one map (see the module doc)."""

    __slots__ = ("chunks", "size")

    def __init__(self, chunks: list[list[K]] | None = None, size: int = 0) -> None:
        self.chunks: list[list[K]] = chunks if chunks is not None else []
        self.size = size

    def first(self, n: int) -> Iterator[K]:
        """The first ``n`` keys, in order."""
        return islice(chain.from_iterable(self.chunks), n)


def _appended(log: _KeyLog[K], n: int, key: K) -> _KeyLog[K]:
    """The log of a map of ``n`` keys plus ``key``: ``log`` itself, grown in place, if it ends at ``n``
    (and is not the shared empty one), else a fork of its first ``n`` keys."""
    if n == 0 or log.size != n:
        full, rem = divmod(n, CHUNK)
        chunks = log.chunks[:full]
        if rem:
            chunks.append(log.chunks[full][:rem])
        log = _KeyLog(chunks, n)
    if not log.chunks or len(log.chunks[-1]) == CHUNK:
        log.chunks.append([])
    log.chunks[-1].append(key)
    log.size += 1
    return log


class FrozenMap(Mapping[K, V]):
    """An immutable ``Mapping`` that iterates in insertion order (see the module doc).

    Build one with :meth:`of`, :meth:`set` or a :class:`MapBuilder`; none changes a map.
    Lookups, ``in`` and :meth:`set` are O(log₃₂ n), ``len`` O(1), iteration O(n).
    """

    __slots__ = ("_items", "_log")

    def __init__(self, items: immutables.Map[K, V] | None = None, log: _KeyLog[K] | None = None) -> None:
        """``items`` and the log its keys were appended to, in order (``len(items)`` of them are this map's)."""
        self._items: immutables.Map[K, V] = items if items is not None else immutables.Map()
        self._log: _KeyLog[K] = log if log is not None else _KeyLog()

    @classmethod
    def of(cls, pairs: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> FrozenMap[K, V]:
        """A map of ``pairs`` (a mapping, or ``(key, value)`` pairs; a repeated key keeps its first place)."""
        builder: MapBuilder[K, V] = MapBuilder()
        for k, v in (pairs.items() if isinstance(pairs, Mapping) else pairs):
            builder[k] = v
        return builder.finish()

    def set(self, key: K, value: V) -> FrozenMap[K, V]:
        """This map with ``key`` set to ``value`` (a new key goes last); ``self`` is unchanged."""
        if key in self._items:
            return FrozenMap(self._items.set(key, value), self._log)
        return FrozenMap(self._items.set(key, value), _appended(self._log, len(self._items), key))

    def merged(self, changes: Mapping[K, V]) -> FrozenMap[K, V]:
        """This map with every key of ``changes`` set (new keys go last, in ``changes``' order); ``self`` is
        unchanged. One change is one :meth:`set`; many go through one :class:`MapBuilder`."""
        if not self._items:  # nothing to share: build in one go
            return from_builtins(changes if isinstance(changes, dict) else dict(changes))
        if len(changes) == 1:
            ((key, value),) = changes.items()
            return self.set(key, value)
        builder = MapBuilder(self)
        for key, value in changes.items():
            builder[key] = value
        return builder.finish()

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, default: V | T, /) -> V | T: ...
    def get(self, key: K, default: object = None, /) -> object:
        return self._items.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[K]:
        return self._log.first(len(self._items))

    def to_dict(self) -> dict[K, V]:
        """A new ``dict`` with the same entries in the same order (O(n))."""
        items = self._items
        return {k: items[k] for k in self._log.first(len(items))}

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenMap):
            return self._items == other._items
        return isinstance(other, Mapping) and self.to_dict() == dict(other.items())

    __hash__ = None  # type: ignore[assignment]  # like dict: values need not be hashable

    def __repr__(self) -> str:
        return f"FrozenMap({self.to_dict()!r})"


class MapBuilder(Generic[K, V]):
    """The mutable side of a :class:`FrozenMap`: start from one (or empty), set keys, :meth:`finish`.

    Setting a key is an in-place trie update (``immutables.Map.mutate``), O(log₃₂ n); the
    map it started from is untouched. One builder makes one map: after :meth:`finish` it
    must not be used again.
    """

    __slots__ = ("_log", "_mut")

    def __init__(self, start: FrozenMap[K, V] | None = None) -> None:
        base: FrozenMap[K, V] = start if start is not None else FrozenMap()
        self._mut: immutables.MapMutation[K, V] = base._items.mutate()
        self._log = base._log

    def __getitem__(self, key: K) -> V:
        return self._mut[key]

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, default: V | T, /) -> V | T: ...
    def get(self, key: K, default: object = None, /) -> object:
        """The value of ``key`` as set so far, else ``default``."""
        return self._mut.get(key, default)

    def __contains__(self, key: K) -> bool:
        return key in self._mut

    def __setitem__(self, key: K, value: V) -> None:
        if key not in self._mut:
            self._log = _appended(self._log, len(self._mut), key)
        self._mut[key] = value

    def finish(self) -> FrozenMap[K, V]:
        """The map as built (O(1)); the builder is spent."""
        return FrozenMap(self._mut.finish(), self._log)


class FrozenVector(Sequence[V]):
    """An immutable sequence with O(log₃₂ n) :meth:`append` and :meth:`replace` (see the module doc).

    Reads like a ``tuple`` (index, negative index, slice → ``tuple``, ``len``, iteration) and
    compares equal to any sequence with the same items.
    """

    __slots__ = ("_items",)

    def __init__(self, items: immutables.Map[int, V] | None = None) -> None:
        """``items``: position → item, for positions ``0 … len(items) - 1``."""
        self._items: immutables.Map[int, V] = items if items is not None else immutables.Map()

    @classmethod
    def of(cls, items: Iterable[V] = ()) -> FrozenVector[V]:
        """A vector of ``items``, in order."""
        return cls(immutables.Map(enumerate(items)))

    def append(self, item: V) -> FrozenVector[V]:
        """This vector with ``item`` at the end; ``self`` is unchanged."""
        return FrozenVector(self._items.set(len(self._items), item))

    def replace(self, index: int, item: V) -> FrozenVector[V]:
        """This vector with ``item`` at ``index`` (negative counts from the end). Raises IndexError."""
        return FrozenVector(self._items.set(self._position(index), item))

    def _position(self, index: int) -> int:
        n = len(self._items)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"index {index} out of range for {n} items")
        return i

    @overload
    def __getitem__(self, index: int) -> V: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[V, ...]: ...
    def __getitem__(self, index: int | slice) -> V | tuple[V, ...]:
        if isinstance(index, slice):
            return tuple(map(self._items.__getitem__, range(*index.indices(len(self._items)))))
        return self._items[self._position(index)]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[V]:
        return map(self._items.__getitem__, range(len(self._items)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenVector):
            return self._items == other._items
        return isinstance(other, Sequence) and not isinstance(other, str | bytes) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"FrozenVector({list(self)!r})"


def enc_hook(obj: Any) -> Any:
    """msgspec ``enc_hook``: a :class:`FrozenMap` encodes as the ``dict`` of its entries, in order; a
    :class:`FrozenVector` as the ``list`` of its items.

    Raises:
        NotImplementedError: any other unsupported type (msgspec reports it).
    """
    if isinstance(obj, FrozenMap):
        return obj.to_dict()
    if isinstance(obj, FrozenVector):
        return list(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def from_builtins(entries: dict[Any, Any]) -> FrozenMap[Any, Any]:
    """The :class:`FrozenMap` of a decoded (already typed) ``dict``, keeping its order (O(n))."""
    keys = list(entries)
    return FrozenMap(immutables.Map(entries), _KeyLog([keys[i:i + CHUNK] for i in range(0, len(keys), CHUNK)],
                                                      len(keys)))
