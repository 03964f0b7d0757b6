"""The lease value and argument checks shared by every lock backend."""

from __future__ import annotations

import math
import os
import secrets
import time
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["Lease", "check_timeout", "check_ttl", "new_token"]

#: Longest TTL or timeout accepted, in seconds. Anything longer is a unit mistake.
MAX_SECONDS = 7 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Lease:
    """Proof of holding a lock, returned by ``acquire``.

    Attributes:
        resource: The lock's name.
        token: 128 random bits (hex): this lease's own, never shared between tasks.
        fence: The fencing token: it increases with every lease granted on the
            resource, so a store that remembers the highest token it has seen can
            reject writes from a holder that was paused past its lease. It is 0 only
            from a backend told to count none (``RedlockBackend(fencing=False)``),
            and then proves nothing to a store.
        deadline: The monotonic time (``time.monotonic()``) until which the holder
            may assume it still owns the lock; counted from *before* the acquire
            request was sent, so it never overstates the lease.
        ttl: The lease's length in seconds, as granted.
    """

    resource: str
    token: str
    fence: int
    deadline: float
    ttl: float

    def remaining(self, now: float | None = None) -> float:
        """Seconds of validity left (negative once expired).

        Args:
            now: The monotonic time to count from; default None: ``time.monotonic()``.
        """
        return self.deadline - (time.monotonic() if now is None else now)

    def renewed(self, ttl_ms: int, sent: float) -> Lease:
        """This lease renewed (for backends: the value a successful ``extend`` returns).

        Args:
            ttl_ms: The new length in milliseconds.
            sent: The monotonic time the renewal was asked, in seconds: the new
                deadline counts from it.
        """
        return Lease(self.resource, self.token, self.fence, sent + ttl_ms / 1000, ttl_ms / 1000)


#: The owner label new tokens start with, hex-encoded and followed by a dot (set by
#: ``headway.lock.introspection.owned_by`` for one acquire); "" for none.
OWNER_PREFIX: ContextVar[str] = ContextVar("headway_lock_owner_prefix", default="")

#: Tokens read ahead from the OS's CSPRNG, 256 per system call. ``list.pop`` is atomic,
#: so threads never share one, and a forked child starts empty (it must not reuse the
#: parent's).
_tokens: list[str] = []
if hasattr(os, "register_at_fork"):  # POSIX; Windows has no fork
    os.register_at_fork(after_in_child=_tokens.clear)


def new_token() -> str:
    """128 random bits, hex-encoded: unique per lease, never shared between tasks.

    Under ``headway.lock.introspection.owned_by`` the owner label comes first, hex
    encoded, then a dot: stores keep it with the token, and ``inspect`` reads it back.
    """
    while True:
        try:
            return OWNER_PREFIX.get() + _tokens.pop()
        except IndexError:
            raw = secrets.token_hex(16 * 256)
            _tokens.extend(raw[i : i + 32] for i in range(0, len(raw), 32))


def _finite_seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if value > MAX_SECONDS:
        raise ValueError(f"{name}={value!r} s is longer than {MAX_SECONDS:.0f} s; check the unit")
    return value


def check_ttl(ttl: float) -> int:
    """Validate a lease TTL in seconds; return it in whole milliseconds (at least 1)."""
    seconds = _finite_seconds("ttl", ttl)
    if seconds <= 0:
        raise ValueError(f"ttl must be > 0, got {ttl!r}")
    return max(1, round(seconds * 1000))


def check_timeout(timeout: float) -> float:
    """Validate a wait timeout in seconds (0 means a single attempt)."""
    seconds = _finite_seconds("timeout", timeout)
    if seconds < 0:
        raise ValueError(f"timeout must be >= 0, got {timeout!r}")
    return seconds
