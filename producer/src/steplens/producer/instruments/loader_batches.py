"""What ``timed(loader)`` can read of the batches it hands over: their token ids, attention
mask and labels, for the data-quality checks (``log_batch``'s) without a call of the user's.

A batch is understood when it is a mapping or an object with ``input_ids`` (Hugging Face's
collators and ``BatchEncoding``; ``attention_mask`` and ``labels`` beside it), a 1-D or 2-D
integer tensor or array (the token ids themselves), or a tuple or list whose first item is
one (its second item, an integer tensor or array, is the labels). Anything else (images,
float features, a custom class) is left alone. The caller's thread only looks the fields up;
the worker thread computes lengths, hashes and label counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _integer_ids(x: Any) -> bool:
    """Whether ``x`` is a 1-D or 2-D tensor or array of integers (not booleans)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None or getattr(x, "ndim", None) not in (1, 2):
        return False
    if hasattr(dtype, "is_floating_point"):  # a torch dtype
        return not (dtype.is_floating_point or dtype.is_complex or str(dtype) == "torch.bool")
    return getattr(dtype, "kind", "") in ("i", "u")  # a numpy dtype


def token_fields(batch: Any) -> tuple[Any, Any, Any] | None:
    """``(input_ids, attention_mask, labels)`` of a batch (None where absent), or None when
    the batch holds no token ids this module understands."""
    if isinstance(batch, Mapping):
        ids = batch.get("input_ids")
        if ids is None:
            return None
        return ids, batch.get("attention_mask"), batch.get("labels")
    ids = getattr(batch, "input_ids", None)
    if ids is not None:
        return ids, getattr(batch, "attention_mask", None), getattr(batch, "labels", None)
    if _integer_ids(batch):
        return batch, None, None
    if isinstance(batch, (tuple, list)) and batch and _integer_ids(batch[0]):
        labels = batch[1] if len(batch) > 1 and _integer_ids(batch[1]) else None
        return batch[0], None, labels
    return None
