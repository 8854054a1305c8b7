"""The input checks every metric runs before computing, and the array types they return.

Each check raises ``ValueError`` saying what is wrong, so that a metric never returns a number
computed over empty, ragged or non-finite input. They are for the metric modules only (``_metrics``
and the modules it re-exports), hence their leading underscore.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["F64", "I64", "_bins", "_reals", "_same_length", "_unit", "_vector", "_weights"]

F64: TypeAlias = NDArray[np.float64]
I64: TypeAlias = NDArray[np.int64]


def _vector(values: ArrayLike, name: str) -> NDArray[Any]:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.size == 0:
        raise ValueError(f"{name} is empty: a metric over no rows is undefined")
    return array


def _reals(values: ArrayLike, name: str) -> F64:
    array = _vector(values, name)
    if array.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be numeric, got dtype {array.dtype}")
    floats = array.astype(np.float64)
    if not np.isfinite(floats).all():
        raise ValueError(f"{name} has NaN or infinite values")
    return floats


def _unit(values: ArrayLike, name: str) -> F64:
    floats = _reals(values, name)
    if ((floats < 0.0) | (floats > 1.0)).any():
        raise ValueError(f"{name} must lie in [0, 1]")
    return floats


def _same_length(name: str, first: NDArray[Any], *others: NDArray[Any]) -> None:
    for other in others:
        if len(other) != len(first):
            raise ValueError(f"{name}: arrays have different lengths ({len(first)} and {len(other)})")


def _weights(weight: ArrayLike | None, n: int) -> F64:
    if weight is None:
        return np.ones(n)
    w = _reals(weight, "weight")
    if len(w) != n:
        raise ValueError(f"weight has {len(w)} rows, the data {n}")
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError("weight must be non-negative with a positive sum")
    return w


def _bins(bins: int) -> None:
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
