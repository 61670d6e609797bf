"""The metric-name rule (``valid_name``), checked on decoded records after msgspec.

msgspec checks a name's length (``kinds.MetricName``); the rule on its characters is a regex, and
a regex per key inside msgspec costs a step_batch entry several times its decode. Here names seen
valid are remembered, so a producer's usual names cost one C-level set test per map.
"""

from __future__ import annotations

import itertools
import operator
import re
from typing import Any, Final

from steplens.schema.fields import payload_fields, struct_fields
from steplens.schema.kinds import KINDS, MAX_NAME_LEN, NAME_PATTERN, StepEntry
from steplens.schema.record import DecodeError

_NAME_RE: Final = re.compile(NAME_PATTERN)


def valid_name(name: object) -> bool:
    """Whether ``name`` may name a metric (the rule every decoder applies)."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_NAME_LEN
        and _NAME_RE.search(name) is not None
    )


_VALID_NAMES: set[str] = set()
_VALID_NAMES_MAX: Final = 1 << 16
_NAME_FIELDS: Final = {
    kind: tuple(n for n, f in payload_fields(kind).items() if f.metric_names) for kind in KINDS
}
_ENTRY_NAME_FIELDS: Final = tuple(n for n, f in struct_fields(StepEntry).items() if f.metric_names)


def _bad_name(keys: Any) -> str | None:
    """The first invalid metric name among ``keys``, or None."""
    if _VALID_NAMES.issuperset(keys):
        return None
    for k in keys:
        if k not in _VALID_NAMES:
            if not valid_name(k):
                return str(k)
            if len(_VALID_NAMES) >= _VALID_NAMES_MAX:
                _VALID_NAMES.clear()
            _VALID_NAMES.add(k)
    return None


def check_names(kind: str, data: dict[str, Any], raw_prefix: bytes) -> DecodeError | None:
    """A DecodeError naming the first invalid metric name of a record's data, or None."""
    known = _VALID_NAMES.issuperset
    fine = True
    for n in _NAME_FIELDS[kind]:
        if n in data and not known(data[n]):
            fine = False
    if kind == "step_batch":  # every entry's names at once, one map field at a time, in C
        records = data["records"]
        for get in _ENTRY_MAPS:
            fine = fine and known(_chain(filter(None, map(get, records))))
    if fine:
        return None
    where = [(f"data.{n}", data[n]) for n in _NAME_FIELDS[kind] if n in data]
    if kind == "step_batch":
        for i, entry in enumerate(data["records"]):
            where += [
                (f"data.records[{i}].{n}", entry[n]) for n in _ENTRY_NAME_FIELDS if n in entry
            ]
    for path, mapping in where:
        bad = _bad_name(mapping)
        if bad is not None:
            return DecodeError(
                f"bad metric name {bad[:40]!r}: must be 1 to {MAX_NAME_LEN} characters, "
                "no control characters",
                path,
                raw_prefix,
            )
    return None


_chain = itertools.chain.from_iterable
_ENTRY_MAPS: Final = tuple(operator.methodcaller("get", n) for n in _ENTRY_NAME_FIELDS)
