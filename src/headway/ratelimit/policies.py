"""Rate-limit policies: small frozen values with validated parameters.

Which algorithm a policy runs is said once, in ``algorithms.py``'s table.
Every policy reduces to integers before it reaches a script: windows and
refill intervals in whole microseconds, limits in units. Scripts and the
in-memory model then compute with exact integer arithmetic (all products stay
below 2**53, so Lua's doubles hold them exactly), which is what lets the
differential tests demand *identical* decisions from both.

A refill interval that does not divide evenly is rounded *up*: a bucket never
refills faster than asked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

__all__ = [
    "MAX_UNITS",
    "Concurrency",
    "FixedWindow",
    "LeakyBucket",
    "OnError",
    "Policy",
    "SlidingCounter",
    "SlidingLog",
    "TokenBucket",
]

OnError = Literal["allow", "deny"]

#: Largest limit or capacity accepted (a bigger one is almost surely a unit mistake).
MAX_UNITS = 1_000_000_000
#: Longest window or refill period, in seconds (a year).
MAX_PERIOD = 366 * 24 * 3600.0
#: The sliding log keeps one sorted-set entry per unit: cap its size.
MAX_LOG = 100_000
#: Products of units and microseconds must stay exact in a double.
_EXACT = 2**51


def _units(cls: str, name: str, value: int, cap: int = MAX_UNITS) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{cls}.{name} must be an int, not {type(value).__name__}")
    if not 1 <= value <= cap:
        raise ValueError(f"{cls}.{name} must be between 1 and {cap}, got {value}")


def _micros(cls: str, name: str, seconds: float) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"{cls}.{name} must be a number of seconds, not {type(seconds).__name__}")
    if not math.isfinite(seconds) or not 0.001 <= seconds <= MAX_PERIOD:
        raise ValueError(
            f"{cls}.{name} must be between 0.001 and {MAX_PERIOD:.0f} seconds, got {seconds!r}"
        )
    return round(seconds * 1_000_000)


def _on_error(cls: str, value: str) -> None:
    if value not in ("allow", "deny"):
        raise ValueError(f"{cls}.on_error must be 'allow' or 'deny', got {value!r}")


def _exact(cls: str, units: int, micros: int) -> None:
    if units * micros > _EXACT:
        raise ValueError(
            f"{cls}: {units} units over {micros} us exceeds what is computed exactly; "
            "use a coarser unit (fewer, costlier units) or a shorter period"
        )


@dataclass(frozen=True, slots=True)
class _Bucket:
    capacity: int
    rate: int
    period: float = 1.0
    on_error: OnError = "allow"

    name: ClassVar[str]
    tag: ClassVar[str]

    def __post_init__(self) -> None:
        cls = type(self).__name__
        _units(cls, "capacity", self.capacity)
        _units(cls, "rate", self.rate)
        _micros(cls, "period", self.period)
        _on_error(cls, self.on_error)
        _exact(cls, self.capacity, self.interval_us)

    @property
    def limit(self) -> int:
        """The most units admitted at once."""
        return self.capacity

    @property
    def interval_us(self) -> int:
        """Microseconds per unit of refill (or leak), rounded up."""
        return -(-_micros(type(self).__name__, "period", self.period) // self.rate)

    def params(self) -> tuple[int, int]:
        """The two integers the scripts receive: (interval_us, capacity)."""
        return self.interval_us, self.capacity

    @property
    def key_part(self) -> str:
        """A key suffix naming this policy's parameters (its state is not shared)."""
        return f"{self.tag}{self.capacity}r{self.interval_us}"

    @property
    def window(self) -> float:
        """Seconds for a completely drained bucket to refill (used in headers)."""
        return self.capacity * self.interval_us / 1_000_000


@dataclass(frozen=True, slots=True)
class TokenBucket(_Bucket):
    """Up to ``capacity`` units at once, refilled by ``rate`` units every ``period`` seconds.

    Implemented as GCRA: the state is one number per key, the theoretical
    arrival time, which is exactly a continuous token bucket.

    Args:
        capacity: The most units admitted at once (the burst), 1 to 10**9.
        rate: Units refilled every ``period``, 1 to 10**9; the refill interval
            (``period / rate``) is kept in whole microseconds, rounded up.
        period: Seconds over which ``rate`` units refill, 0.001 to a year; default 1.0.
        on_error: What to decide when the backend fails or is slower than its budget:
            ``"allow"`` (default, fail open) or ``"deny"`` (fail closed).

    Raises:
        TypeError: A parameter of the wrong type.
        ValueError: A parameter out of range, or units times microseconds too large
            to compute exactly.
    """

    name: ClassVar[str] = "token_bucket"
    tag: ClassVar[str] = "tb"


@dataclass(frozen=True, slots=True)
class LeakyBucket(_Bucket):
    """A bucket of ``capacity`` units that leaks ``rate`` units every ``period`` seconds.

    The leaky bucket as a meter: a request is admitted when its cost still fits
    in the bucket. The state is the level and when it was measured.

    Args:
        capacity: The bucket's size in units, 1 to 10**9.
        rate: Units leaked every ``period``, 1 to 10**9; the leak interval
            (``period / rate``) is kept in whole microseconds, rounded up.
        period: Seconds over which ``rate`` units leak, 0.001 to a year; default 1.0.
        on_error: What to decide when the backend fails or is slower than its budget:
            ``"allow"`` (default, fail open) or ``"deny"`` (fail closed).

    Raises:
        TypeError: A parameter of the wrong type.
        ValueError: A parameter out of range, or units times microseconds too large
            to compute exactly.
    """

    name: ClassVar[str] = "leaky_bucket"
    tag: ClassVar[str] = "lb"


@dataclass(frozen=True, slots=True)
class _Window:
    limit: int
    window: float = 1.0
    on_error: OnError = "allow"

    name: ClassVar[str]
    tag: ClassVar[str]
    max_limit: ClassVar[int] = MAX_UNITS

    def __post_init__(self) -> None:
        cls = type(self).__name__
        _units(cls, "limit", self.limit, self.max_limit)
        _exact(cls, self.limit, _micros(cls, "window", self.window))
        _on_error(cls, self.on_error)

    @property
    def window_us(self) -> int:
        """The window in whole microseconds."""
        return round(self.window * 1_000_000)

    def params(self) -> tuple[int, int]:
        """The two integers the scripts receive: (window_us, limit)."""
        return self.window_us, self.limit

    @property
    def key_part(self) -> str:
        """A key suffix naming this policy's parameters (its state is not shared)."""
        return f"{self.tag}{self.limit}w{self.window_us}"


@dataclass(frozen=True, slots=True)
class FixedWindow(_Window):
    """At most ``limit`` units per window; windows are aligned on the server's epoch clock.

    Args:
        limit: Units admitted per window, 1 to 10**9.
        window: The window in seconds, 0.001 to a year; default 1.0.
        on_error: What to decide when the backend fails or is slower than its budget:
            ``"allow"`` (default, fail open) or ``"deny"`` (fail closed).

    Raises:
        TypeError: A parameter of the wrong type.
        ValueError: A parameter out of range, or units times microseconds too large
            to compute exactly.
    """

    name: ClassVar[str] = "fixed_window"
    tag: ClassVar[str] = "fw"


@dataclass(frozen=True, slots=True)
class SlidingLog(_Window):
    """At most ``limit`` units in any ``window`` seconds, exactly (one log entry per unit).

    Args:
        limit: Units admitted per window, 1 to 100,000.
        window: The window in seconds, 0.001 to a year; default 1.0.
        on_error: What to decide when the backend fails or is slower than its budget:
            ``"allow"`` (default, fail open) or ``"deny"`` (fail closed).

    Raises:
        TypeError: A parameter of the wrong type.
        ValueError: A parameter out of range, or units times microseconds too large
            to compute exactly.
    """

    name: ClassVar[str] = "sliding_log"
    tag: ClassVar[str] = "sl"
    max_limit: ClassVar[int] = MAX_LOG


@dataclass(frozen=True, slots=True)
class SlidingCounter(_Window):
    """About ``limit`` units per sliding window: the previous window's count, weighted.

    The estimate is ``previous * (1 - elapsed/window) + current``; it never lets
    more than ``limit`` through in one fixed window, and smooths the boundary.

    Args:
        limit: Units admitted per window, 1 to 10**9.
        window: The window in seconds, 0.001 to a year; default 1.0.
        on_error: What to decide when the backend fails or is slower than its budget:
            ``"allow"`` (default, fail open) or ``"deny"`` (fail closed).

    Raises:
        TypeError: A parameter of the wrong type.
        ValueError: A parameter out of range, or units times microseconds too large
            to compute exactly.
    """

    name: ClassVar[str] = "sliding_counter"
    tag: ClassVar[str] = "sc"


Policy = TokenBucket | LeakyBucket | FixedWindow | SlidingLog | SlidingCounter
"""Any rate-limit policy (``Concurrency`` is not one: it limits requests in flight)."""


#: Longest lease a concurrency slot may ask for, in seconds (a day; renew for longer).
MAX_SLOT_TTL = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Concurrency:
    """At most ``limit`` requests in flight per key, each holding a slot for ``ttl`` seconds.

    A slot is a lease, like the lock's: released when the work ends, renewed
    while it goes on (``ConcurrencyLimiter.hold``), and lost by a holder that
    dies once ``ttl`` passes.

    Args:
        limit: Slots per key, 1 to 100,000.
        ttl: The slot's lease in seconds, 0.001 to a day (86,400); default 30.0.
        on_error: What to do when the backend fails or is slower than its budget:
            ``"allow"`` (default) runs the work without a slot, ``"deny"`` refuses it.

    Raises:
        TypeError: A parameter of the wrong type.
        ValueError: A parameter out of range.
    """

    limit: int
    ttl: float = 30.0
    on_error: OnError = "allow"

    name: ClassVar[str] = "concurrency"
    tag: ClassVar[str] = "cc"

    def __post_init__(self) -> None:
        _units("Concurrency", "limit", self.limit, MAX_LOG)
        if isinstance(self.ttl, bool) or not isinstance(self.ttl, int | float):
            raise TypeError(f"Concurrency.ttl must be a number of seconds, not {self.ttl!r}")
        if not math.isfinite(self.ttl) or not 0.001 <= self.ttl <= MAX_SLOT_TTL:
            raise ValueError(
                f"Concurrency.ttl must be between 0.001 and {MAX_SLOT_TTL:.0f} seconds, "
                f"got {self.ttl!r}"
            )
        _on_error("Concurrency", self.on_error)

    @property
    def ttl_ms(self) -> int:
        """The lease length in whole milliseconds."""
        return round(self.ttl * 1000)

    @property
    def key_part(self) -> str:
        """A key suffix naming the limit (limiters with another limit keep their own slots)."""
        return f"{self.tag}{self.limit}"
