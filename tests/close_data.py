"""Compare data whose floats came out of BLAS or LAPACK (statsmodels' fits, numpy's reductions)
on another CPU: OpenBLAS picks its kernels per CPU, so such a float may differ in its last bits
from one machine to the next. Floats compare within a relative tolerance far above those bits
and far below any real change; every other value (text, integers, None, the shape of the data)
compares exactly."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

REL = 1e-9  # another CPU's rounding, carried through fits, stays below 1e-12 relative
ABS = 1e-12  # for values that should be zero and came out as a rounding residue


def leaves(data: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every scalar of ``data`` (dataclasses, mappings, sequences, numpy arrays) with its path."""
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        yield path + ":type", type(data).__name__
        for f in dataclasses.fields(data):
            yield from leaves(getattr(data, f.name), f"{path}.{f.name}")
    elif isinstance(data, dict):
        yield path + ":keys", tuple(map(repr, data))
        for key, value in data.items():
            yield from leaves(value, f"{path}[{key!r}]")
    elif isinstance(data, (list, tuple, np.ndarray)):
        items = data.tolist() if isinstance(data, np.ndarray) else data
        yield path + ":len", len(items)
        for i, value in enumerate(items):
            yield from leaves(value, f"{path}[{i}]")
    elif isinstance(data, np.generic):
        yield path, data.item()
    else:
        yield path, data


def assert_close(got: Any, want: Any, rel: float = REL, abs_: float = ABS) -> None:
    """``got`` equals ``want`` but for floats within ``rel``/``abs_`` (NaN equals NaN)."""
    g, w = list(leaves(got)), list(leaves(want))
    assert [p for p, _ in g] == [p for p, _ in w], "the data differ in shape"
    bad = []
    for (path, a), (_, b) in zip(g, w, strict=True):
        if isinstance(a, float) and isinstance(b, float):
            same = (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=rel, abs=abs_)
        else:
            same = type(a) is type(b) and a == b
        if not same:
            bad.append(f"{path}: {a!r} != {b!r}")
    assert not bad, f"{len(bad)} of {len(g)} values differ: " + "; ".join(bad[:5])
