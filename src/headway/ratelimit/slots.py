"""Concurrency slots: the values a concurrency limiter returns, and their pure helpers.

A slot is one permit of a lock with ``limit`` permits per key, held as a
``Lease`` like any lock's. The backend keeps, per key, the set of lease
tokens and when each lease ends; a lease that is neither released nor
renewed simply ends, so a holder that dies frees its slot after ``ttl``.
"""

from __future__ import annotations

from dataclasses import dataclass

from headway._keys import tagged
from headway.lock.lease import Lease
from headway.ratelimit.decision import _FAILED_CLOSED, _FAILED_OPEN, Source
from headway.ratelimit.policies import Concurrency

__all__ = [
    "PERMIT_FENCE",
    "Admission",
    "Grant",
    "admitted",
    "failed_admission",
    "slot_key",
]

#: The fencing token of every slot's lease. ``limit`` holders share a key at once, so
#: no order among them protects a write: permits keep no counter (a round trip's work
#: saved), and a store must not take a slot's lease for a fencing token.
PERMIT_FENCE = 0


@dataclass(frozen=True, slots=True)
class Grant:
    """A backend's answer to a slot request (``ConcurrencyBackend.acquire_slot``).

    Attributes:
        granted: Whether the slot was taken.
        in_flight: The slots held right after (this one included when granted).
        wait_us: When refused, microseconds until the first held lease ends (0 when
            granted).
    """

    granted: bool
    in_flight: int
    wait_us: int


@dataclass(frozen=True, slots=True)
class Admission:
    """Whether work may start under a concurrency limit, and the slot's lease it then holds.

    An admission is true when allowed.

    Attributes:
        allowed: Whether the work may start.
        limit: The policy's slots per key.
        in_flight: The slots held right after the decision (this one included when
            admitted).
        retry_after: When refused, seconds until the first lease ends even if nobody
            releases it: an upper bound, since any release frees a slot earlier (0
            when admitted).
        policy: The ``Concurrency`` policy.
        slot: The slot's ``Lease`` (``resource`` is the key, ``fence`` is 0); None
            when refused, or when a failure mode admitted the work without asking
            the backend (``source`` says which).
        source: Whether the backend decided, or a failure mode.
    """

    allowed: bool
    limit: int
    in_flight: int
    retry_after: float
    policy: Concurrency
    slot: Lease | None = None
    source: Source = Source.BACKEND

    @property
    def remaining(self) -> int:
        """Slots still free right after the decision."""
        return max(0, self.limit - self.in_flight)

    @property
    def failed(self) -> bool:
        """True when the backend did not decide (a failure mode answered instead)."""
        return self.source is _FAILED_OPEN or self.source is _FAILED_CLOSED

    def __bool__(self) -> bool:
        return self.allowed


def slot_key(key: str, policy: Concurrency) -> str:
    """The holders key of ``key``'s slots (same hash tag as its rate-limit state).

    The slots are a semaphore's permits (``lock.modes.permits(policy.limit)``) whose
    family is named after this key (``lock/backends/redis/mode_keys.family_keys``):
    on Redis the holders are this one sorted set, the rest of the family's keys exist
    only while a fenced holder or a waiter does (which the limiter never makes).
    """
    return tagged("rl", key, policy.key_part)[0]


def admitted(grant: Grant, key: str, policy: Concurrency, token: str, sent: float) -> Admission:
    """The admission a backend's grant means, for a request sent at monotonic ``sent``.

    The lease's deadline counts from ``sent`` (before the request), so it never
    overstates the lease.
    """
    lease = None
    if grant.granted:
        ttl = policy.ttl_ms / 1000
        lease = Lease(key, token, PERMIT_FENCE, sent + ttl, ttl)
    return Admission(
        allowed=grant.granted,
        limit=policy.limit,
        in_flight=grant.in_flight,
        retry_after=grant.wait_us / 1e6,
        policy=policy,
        slot=lease,
    )


def failed_admission(policy: Concurrency, retry_after: float) -> Admission:
    """The admission when the backend failed: the policy's ``on_error`` decides."""
    allow = policy.on_error == "allow"
    return Admission(
        allowed=allow,
        limit=policy.limit,
        in_flight=0,
        retry_after=0.0 if allow else retry_after,
        policy=policy,
        source=Source.FAILED_OPEN if allow else Source.FAILED_CLOSED,
    )
