"""What a backend implements to reserve and settle (metered costs), and the helpers a store runs.

Optional, like leasing: ``RateLimiter.reserve`` raises ``TypeError`` on a backend without
``reserve`` and ``settle``. Both built-in backends offer them; a backend that stores
states implements them with ``reserve_states`` and ``settle_states`` over the states
``state_names`` names (the same states ``decide`` charges: a key reserved by one
limiter and decided by another with the same policies shares one quota). The rules of
``RateLimitBackend.decide`` hold: atomic per key, the backend's own clock,
``BackendUnavailable`` when the store cannot answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from headway.ratelimit.algorithms import PolicySet
from headway.ratelimit.backends.contract import RateLimitBackend, SyncRateLimitBackend
from headway.ratelimit.decision import Decision, decision_from_reply
from headway.ratelimit.policies import Policy
from headway.ratelimit.settle_model import reserve, settle

__all__ = ["ReservingBackend", "SyncReservingBackend", "reserve_states", "settle_states"]


class ReservingBackend(RateLimitBackend, Protocol):
    """An async backend that can also reserve and settle, for ``RateLimiter.reserve``."""

    async def reserve(
        self, key: str, policies: Sequence[Policy], costs: Sequence[int]
    ) -> tuple[Decision, int]:
        """Charge each policy its own cost (``costs``, in order), all-or-nothing.

        As ``decide`` with one cost per policy (each >= 0 and at most its policy's
        limit), never a peek. Returns the decision and the time of the charge in integer
        microseconds on the backend's clock: what ``settle`` is given back.

        Args:
            key: Whose quota.
            policies: The limiter's policies, as for ``decide``.
            costs: Units to charge each policy, in order.

        Raises:
            BackendUnavailable: The store cannot answer.
        """
        ...

    async def settle(
        self,
        key: str,
        policies: Sequence[Policy],
        at_us: int,
        charged: Sequence[int],
        actual: Sequence[int],
    ) -> int:
        """Change each policy's state by ``actual - charged`` units, by its settle rule.

        ``settle_states`` computes the writes (each algorithm's rule is in
        docs/ratelimit.md, "Metered costs"). Returns the time of the settle in integer
        microseconds on the backend's clock.

        Args:
            key: Whose quota.
            policies: The limiter's policies, as for ``decide``.
            at_us: The time ``reserve`` returned.
            charged: Units the reservation charged each policy, in order.
            actual: Units each policy is settled at, in order (>= 0).

        Raises:
            BackendUnavailable: The store cannot answer.
        """
        ...


class SyncReservingBackend(SyncRateLimitBackend, Protocol):
    """The blocking ``ReservingBackend``, for ``SyncRateLimiter.reserve``."""

    def reserve(
        self, key: str, policies: Sequence[Policy], costs: Sequence[int]
    ) -> tuple[Decision, int]:
        """As ``ReservingBackend.reserve``, blocking.

        Args:
            key: Whose quota.
            policies: The limiter's policies.
            costs: Units to charge each policy, in order.

        Raises:
            BackendUnavailable: The store cannot answer.
        """
        ...

    def settle(
        self,
        key: str,
        policies: Sequence[Policy],
        at_us: int,
        charged: Sequence[int],
        actual: Sequence[int],
    ) -> int:
        """As ``ReservingBackend.settle``, blocking.

        Args:
            key: Whose quota.
            policies: The limiter's policies.
            at_us: The time ``reserve`` returned.
            charged: Units the reservation charged each policy.
            actual: Units each policy is settled at.

        Raises:
            BackendUnavailable: The store cannot answer.
        """
        ...


def reserve_states(
    policies: Sequence[Policy], states: Sequence[object], now_us: int, costs: Sequence[int]
) -> tuple[Decision, list[tuple[object, int]]]:
    """Reserve from the stored states: headway's algorithms, for a backend to run.

    As ``decide_states`` with one cost per policy and no peek: returns the decision
    and, when it charged, one ``(state, ttl_us)`` per policy (else an empty list).
    The time of the charge is ``now_us``.

    Args:
        policies: The limiter's policies.
        states: One stored state per policy, in order (None: none stored).
        now_us: The time in integer microseconds on the backend's clock.
        costs: Units to charge each policy, in order.
    """
    policies = PolicySet.of(policies)
    reply, writes = reserve(states, policies.checks, now_us, costs)
    return decision_from_reply(reply[:-1], policies), [] if writes is None else writes


def settle_states(
    policies: Sequence[Policy],
    states: Sequence[object],
    now_us: int,
    at_us: int,
    charged: Sequence[int],
    actual: Sequence[int],
) -> list[tuple[object, int] | None]:
    """Settle from the stored states: one entry per policy, None to leave that state as it
    is, else ``(state, ttl_us)`` to store in its place for at least ``ttl_us``
    microseconds. Reading the states, this call and the writes are one atomic step.

    Args:
        policies: The limiter's policies.
        states: One stored state per policy, in order (None: none stored).
        now_us: The time in integer microseconds on the backend's clock.
        at_us: The reservation's time (``reserve``'s).
        charged: Units the reservation charged each policy, in order.
        actual: Units each policy is settled at, in order.
    """
    policies = PolicySet.of(policies)
    return settle(states, policies.settles, now_us, at_us, charged, actual)
