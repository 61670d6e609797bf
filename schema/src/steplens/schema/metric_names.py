"""The metric-name rule on decoded records (``schema.valid_name``), checked after msgspec.

A regex per key inside msgspec cost a step_batch entry 2.5x its decode; here names seen valid
are remembered, so a producer's usual names cost one C-level set test per map.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any, Final

from steplens.schema.tables import KINDS, MAX_NAME_LEN, STEP_ENTRY, DecodeError, valid_name

_VALID_NAMES: set[str] = set()
_VALID_NAMES_MAX: Final = 1 << 16
_NAME_FIELDS: Final = {
    kind: tuple(n for n, f in fields.items() if f.names) for kind, fields in KINDS.items()
}
_ENTRY_NAME_FIELDS: Final = tuple(n for n, f in STEP_ENTRY.items() if f.names)


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
