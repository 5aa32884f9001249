"""Summaries of timing samples: percentiles, and whether a series stays flat.  (pure)

Percentiles interpolate linearly between the two nearest ranks (numpy's default,
``method="linear"``), so p99 of 50 samples lies between the 49th and 50th value
rather than being the maximum; ``max`` is reported beside it.

>>> percentile([1.0, 2.0, 3.0, 4.0], 50)
2.5
>>> summarize([4.0, 1.0, 3.0, 2.0]).as_dict()["p95"]
3.85
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

__all__ = ["Summary", "grows", "percentile", "summarize"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``; raises ValueError if empty."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} not in 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Summary:
    """One series of milliseconds (or any unit) in a handful of numbers."""

    n: int
    mean: float
    p50: float
    p95: float
    p99: float
    max: float
    min: float

    def as_dict(self, digits: int = 3) -> dict[str, float | int]:
        return {k: (round(v, digits) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def summarize(values: Sequence[float]) -> Summary:
    """Raises ValueError for an empty series."""
    if not values:
        raise ValueError("summary of no values")
    return Summary(
        n=len(values),
        mean=sum(values) / len(values),
        p50=percentile(values, 50),
        p95=percentile(values, 95),
        p99=percentile(values, 99),
        max=max(values),
        min=min(values),
    )


def grows(series: Sequence[float], *, tolerance: float) -> bool:
    """Whether ``series`` (e.g. RSS samples taken at even intervals, after warm-up)
    keeps rising: its last quarter's mean exceeds its first quarter's by more than
    ``tolerance`` (absolute, in the series' unit). Two or fewer samples never grow.

    >>> grows([10, 10, 11, 10, 10, 10, 11, 10], tolerance=0.5)
    False
    >>> grows([10, 11, 12, 13, 14, 15, 16, 17], tolerance=0.5)
    True
    """
    if len(series) <= 2:
        return False
    quarter = max(1, len(series) // 4)
    first = sum(series[:quarter]) / quarter
    last = sum(series[-quarter:]) / quarter
    return last - first > tolerance
