"""What the declared payload types say about each field, for code that lays records out by field
(the codec's non-finite restore, the metric-name check, the sinks' columns).

``payload_fields(kind)`` answers from the Structs in ``kinds``, in their field order: the type a
decoded value has, whether it is a map of numbers (metrics, counters) and of what, whether its
keys are metric names, and whether strings inside it read back as non-finite floats.
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec

from steplens.schema.kinds import KINDS, NAN_NAMES, MetricName

_UNIONS = (Union, types.UnionType)
_SCALARS = (float, int, str, bool)


@dataclass(frozen=True)
class FieldShape:
    """One payload field. ``python``: the type of its decoded value (float, int, str, bool, list
    or dict); ``numbers``: float or int for a map of numbers, else None; ``metric_names``: its
    keys are metric names; ``free_form``: a container in which the strings "NaN", "Infinity"
    and "-Infinity" read back as floats; ``entries``: the Struct of its items, for a list of
    records (a step_batch's entries)."""

    python: type
    required: bool
    numbers: type | None = None
    metric_names: bool = False
    free_form: bool = False
    entries: type[msgspec.Struct] | None = None


def payload_fields(kind: str) -> dict[str, FieldShape]:
    """The fields of ``kind``'s payload (``KeyError`` for an unknown kind)."""
    return struct_fields(KINDS[kind])


@functools.cache
def struct_fields(struct: type[msgspec.Struct]) -> dict[str, FieldShape]:
    """The fields of a payload Struct (``kinds.StepEntry`` included)."""
    return {f.name: _shape(f.type, f.required) for f in msgspec.structs.fields(struct)}


def _shape(annotation: Any, required: bool) -> FieldShape:
    t = _bare(annotation)
    python = _python(t)
    numbers = metric_names = None
    entries = None
    if python is dict:
        key, value = get_args(t)
        metric_names = key == MetricName
        inner = _python(_bare(value))
        numbers = inner if inner in (float, int) else None
    elif python is list:
        item = _bare(get_args(t)[0])
        if isinstance(item, type) and issubclass(item, msgspec.Struct):
            entries = item
    free_form = python in (dict, list) and entries is None and _names_inside(t)
    return FieldShape(python, required, numbers, bool(metric_names), free_form, entries)


def _bare(t: Any) -> Any:
    """``t`` without its constraints (``Annotated``) and without ``None``."""
    while True:
        if get_origin(t) is Annotated:
            t = get_args(t)[0]
        elif get_origin(t) in _UNIONS and type(None) in get_args(t):
            rest = tuple(a for a in get_args(t) if a is not type(None))
            t = rest[0] if len(rest) == 1 else Union[rest]  # noqa: UP007 - built at run time
        else:
            return t


def _python(t: Any) -> type:
    origin = get_origin(t)
    if origin in (list, dict):
        return origin
    if origin is Literal:
        return type(get_args(t)[0])
    if origin in _UNIONS:  # a number that may be a non-finite name: a float once decoded
        members = [_python(_bare(a)) for a in get_args(t)]
        return float if float in members else members[0]
    return t if t in _SCALARS else object


def _names_inside(t: Any) -> bool:
    """Whether a value of ``t`` may hold a non-finite name where a number may be."""
    t = _bare(t)
    origin = get_origin(t)
    if t is Any:
        return True
    if origin in (list, dict):
        return _names_inside(get_args(t)[-1])
    if origin in _UNIONS:
        members = [_bare(a) for a in get_args(t)]
        return float in members and any(
            m is str or (get_origin(m) is Literal and set(get_args(m)) <= set(NAN_NAMES))
            for m in members
        )
    return False
