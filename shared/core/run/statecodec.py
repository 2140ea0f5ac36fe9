"""The folded state's JSON codec: msgspec with the hooks for FrozenMap, FrozenVector and Steps.

The bytes are what a ``dict``-based state gave (golden ``*.state.json`` files, snapshots).
"""

from __future__ import annotations

import typing
from typing import Any, TypeVar

import msgspec

from reel.shared.core.run.events import StepDecl
from reel.shared.core.run.persistent import FrozenMap, FrozenVector, enc_hook, from_builtins
from reel.shared.core.run.state import RunState, Steps

T = TypeVar("T")



def _dec_hook(kind: Any, obj: Any) -> Any:
    if kind is Steps:
        return Steps(msgspec.convert(obj, tuple[StepDecl, ...]))
    if typing.get_origin(kind) is FrozenMap:
        key, value = typing.get_args(kind)
        return from_builtins(msgspec.convert(obj, dict[key, value], dec_hook=_dec_hook))  # type: ignore[valid-type]
    if typing.get_origin(kind) is FrozenVector:
        (item,) = typing.get_args(kind)
        return FrozenVector.of(msgspec.convert(obj, list[item], dec_hook=_dec_hook))  # type: ignore[valid-type]
    raise NotImplementedError(f"cannot decode {kind!r}")


STATE_ENCODER = msgspec.json.Encoder(enc_hook=enc_hook)
"""JSON encoder for anything holding a folded state (a RunState, BranchState, a snapshot pointer)."""


def encode_state(obj: object) -> bytes:
    """JSON bytes of a :class:`RunState` (or any value holding states): what a ``dict``-based state gave."""
    return STATE_ENCODER.encode(obj)


def state_decoder(kind: type[T]) -> msgspec.json.Decoder[T]:
    """A JSON decoder of ``kind`` (a type holding a :class:`RunState`, e.g. a snapshot pointer)."""
    return msgspec.json.Decoder(kind, dec_hook=_dec_hook)


_decoder = state_decoder(RunState)


def decode_state(data: bytes) -> RunState:
    """A :class:`RunState` from :func:`encode_state` bytes.

    Raises:
        msgspec.ValidationError / msgspec.DecodeError: malformed body.
    """
    return _decoder.decode(data)
