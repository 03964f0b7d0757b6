"""Latency and rate samples shared by the benchmark scripts."""

from __future__ import annotations

import statistics
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
