"""Latency and rate samples shared by the benchmark scripts."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Samples:
    latencies: list[float] = field(default_factory=list)  # seconds
    rates: list[float] = field(default_factory=list)  # requests/s, one per round

    def p50(self) -> float:
        return statistics.median(self.latencies)

    def p99(self) -> float:
        return statistics.quantiles(self.latencies, n=100)[98]

    def rate(self) -> float:
        return statistics.median(self.rates)


@dataclass
class Contention:
    """Workers contending for one lock: grants/s per round, each worker's grants, and
    the most holders ever inside at once (1 for a lock that excludes)."""

    rates: list[float] = field(default_factory=list)
    shares: Counter[int] = field(default_factory=Counter)
    most_inside: int = 0

    def rate(self) -> float:
        return statistics.median(self.rates)

    def summary(self) -> str:
        """``grants/s  inside<= N  shares % [...]``, for a report line."""
        total = sum(self.shares.values()) or 1
        shares = " ".join(f"{100 * self.shares[i] / total:.1f}" for i in sorted(self.shares))
        return f"{self.rate():6.0f} grants/s  inside<= {self.most_inside}  shares % [{shares}]"
