"""What a rate-limit backend implements to lease quota (optional), and ``lease_states``.

``RateLimiter(lease=Leasing(...))`` takes a key's quota in chunks and decides in process
(a quota lease, ``ratelimit/leasing.py``); its backend implements ``LeasingBackend``
(``SyncLeasingBackend`` for ``SyncRateLimiter``) besides ``RateLimitBackend``
(``contract.py``). A backend that only stores states implements ``lease`` with
``lease_states``, headway's leasing model (``ratelimit/lease_model.py``) over the states
``contract.state_names`` names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from headway.ratelimit.algorithms import PolicySet
from headway.ratelimit.backends.contract import RateLimitBackend, SyncRateLimitBackend
from headway.ratelimit.lease_model import give_back, lease
from headway.ratelimit.leasing import Leasing
from headway.ratelimit.policies import Policy

__all__ = ["LeasingBackend", "SyncLeasingBackend", "lease_states"]


class LeasingBackend(RateLimitBackend, Protocol):
    """An async backend that can also lease quota, for ``RateLimiter(lease=Leasing(...))``.

    Optional: a limiter built with ``lease`` raises ``TypeError`` when its backend has no
    ``lease``; every other limiter only calls ``decide`` and ``reset``. A backend that
    stores states implements ``lease`` with ``lease_states`` over the states
    ``state_names`` names, as it implements ``decide`` with ``decide_states``; the rules
    of ``RateLimitBackend.decide`` hold (atomic per key, the backend's own clock,
    ``BackendUnavailable`` when the store cannot answer). A lease charges the same
    states as ``decide``: a key decided by a plain limiter and leased by another shares
    one quota.
    """

    async def lease(
        self,
        key: str,
        policies: Sequence[Policy],
        cost: int,
        leasing: Leasing,
        back: tuple[int, Sequence[int]] = (0, ()),
    ) -> list[int]:
        """Give back ``back``, then lease quota for a request of ``cost`` units on ``key``.

        ``back`` is ``(units, marks)``: unspent units of this limiter's previous lease
        on ``key`` and one mark per policy from that lease's reply; pass it on as it
        came (``(0, ())``: nothing to give back). Units go back only to a state that
        has not moved on since (the same window; no other charge of the bucket).
        ``cost`` 0 only gives back, and replies ``[0]``. Otherwise the lease charges
        every policy, all-or-nothing, ``granted`` units: at least ``cost``, at most
        ``leasing.chunk`` and ``leasing.share`` of the least remaining quota.

        Replies a list of ints, ``granted`` followed by seven per policy, in order:
        ``[granted, ok, remaining, reset_us, retry_us, off, step, mark, ...]``.
        ``granted`` 0 is a refusal: then ``ok``, ``remaining``, ``reset_us`` and
        ``retry_us`` are what ``decide`` would say for ``cost`` (``ok`` 1 or 0, the
        rest in units and microseconds) and ``off``, ``step``, ``mark`` are 0. Else
        ``ok`` is 1, ``remaining`` and ``reset_us`` are after the charge of
        ``granted``, ``retry_us`` is 0, unit ``i`` of the lease (0 for the request
        that took it) may be spent until ``off + i * step`` microseconds after the
        call, and ``mark`` is what ``back`` carries to the next call. The states
        those numbers come from are headway's leasing model's
        (``ratelimit/lease_model.py``): ``lease_states`` computes the reply.

        Args:
            key: Whose quota.
            policies: The limiter's policies, as for ``decide``.
            cost: Units of the request (0: only give ``back``).
            leasing: The limiter's ``Leasing`` (chunk, share, hold).
            back: ``(units, marks)`` of the previous lease to give back; default
                ``(0, ())``: nothing.

        Raises:
            BackendUnavailable: The store cannot answer.
        """
        ...


class SyncLeasingBackend(SyncRateLimitBackend, Protocol):
    """The blocking ``LeasingBackend``, for ``SyncRateLimiter(lease=Leasing(...))``."""

    def lease(
        self,
        key: str,
        policies: Sequence[Policy],
        cost: int,
        leasing: Leasing,
        back: tuple[int, Sequence[int]] = (0, ()),
    ) -> list[int]:
        """As ``LeasingBackend.lease``, blocking.

        Args:
            key: Whose quota.
            policies: The limiter's policies.
            cost: Units of the request (0: only give ``back``).
            leasing: The limiter's ``Leasing``.
            back: ``(units, marks)`` of the previous lease to give back; default
                ``(0, ())``: nothing.

        Raises:
            BackendUnavailable: The store cannot answer.
        """
        ...


def lease_states(
    policies: Sequence[Policy],
    states: Sequence[object],
    now_us: int,
    cost: int,
    leasing: Leasing,
    back: tuple[int, Sequence[int]] = (0, ()),
) -> tuple[list[int], list[tuple[object, int | None] | None]]:
    """Lease from the stored states: headway's leasing model, for a backend to run.

    The arguments are ``LeasingBackend.lease``'s, with ``states`` and ``now_us`` as in
    ``decide_states`` (one state per policy, in the order ``state_names`` names them;
    the time in integer microseconds on the backend's clock). Returns the reply that
    ``lease`` returns, and the writes: one entry per policy, in order, None to leave
    that state as it is, else ``(state, ttl_us)``. Store each state in place of the
    one read, for at least ``ttl_us`` microseconds; ``ttl_us`` None means that units
    were only given back to the state: keep the expiry the stored state has (a later
    one decides the same). Reading the states, this call and the writes must be one
    atomic step per key.

    Args:
        policies: The limiter's policies.
        states: One stored state per policy, in order (None: none stored).
        now_us: The time in integer microseconds on the backend's clock.
        cost: Units of the request (0: only give ``back``).
        leasing: The limiter's ``Leasing``.
        back: ``(units, marks)`` of the previous lease to give back; default
            ``(0, ())``: nothing.
    """
    policies = PolicySet.of(policies)
    states = list(states)
    writes: list[tuple[object, int | None] | None] = [None] * len(states)
    units, marks = back
    if units:
        leases, specs = policies.leases, policies.specs
        for i, ((_, a, _), mark) in enumerate(zip(specs, marks, strict=True)):
            returned = give_back(leases[i], states[i], mark, units, a)
            if returned is not None:
                states[i] = returned
                writes[i] = (returned, None)
    if cost == 0:
        return [0], writes
    terms = (leasing.chunk, leasing.permille, leasing.hold_us)
    reply, charged = lease(states, policies.checks, policies.leases, now_us, cost, *terms)
    for i, (state, ttl_us) in enumerate(charged or ()):
        writes[i] = (state, ttl_us)
    return reply, writes
