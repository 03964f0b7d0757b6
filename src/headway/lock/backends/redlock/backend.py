"""Redlock: one lock over N independent Redis servers, held while a majority holds it.

Every operation is one script call sent to all nodes at once (``nodes.py``: headway's
pipelined connections), each bounded by ``node_timeout``; a node that fails or does not
answer in time counts as a no. An acquire round is granted by a majority (N//2+1) of
nodes; its lease is valid until the first send + ``ttl - drift`` (``drift = ttl *
drift_factor + 2 ms``), so it has ``ttl - elapsed - drift`` left when granted, and must
have some. A round that falls short is undone on every node, answering or not, and
retried after a random delay until the timeout. Rounds never queue: each node sees
single attempts (``lock/redlock_acquire``: SET NX and, in the same script, the node's
fence), and each round has a fresh token, so a late release from an old round can never
remove a newer round's key. A cycle is two round trips (acquire, release) and 6 commands
per node with fencing (FCALL, SET, INCR; FCALL, GET, DEL), 5 without.

Fencing across node failures
----------------------------
Each granting node returns its own fence (its counter plus one, in the script that
grants); the lease's fence ``t`` is the highest of them. Call ``H`` the granting nodes
whose counter is ``t`` after the grant. When a majority returned ``t`` itself, ``H`` is
that majority and the lease is returned at once: the usual case, as every release of a
failed round raises all counters to the highest fence it saw, so counters stay equal.
Otherwise a write-back round (``lock/fence_raise``) raises every node's counter to at
least ``t``, and the lease is granted only if a majority of nodes *that granted it*
confirm, still holding the key: they are ``H``. Either way ``H`` is a majority whose
counters reached ``t`` while they held the key.

Claim: a lease L2 granted after L1 was returned has ``t2 > t1``. L2 needs a
majority M2, which meets H1 in some node n. At n, L2's acquire ran after n's
counter reached t1: (a) trivially if L2's round started after L1 was returned; (b) if
the round overlapped, n held L1's key from L1's acquire until L1 released it or
it expired, both after L1 was returned (keys outlive validity: Redlock's own
clock assumption). L2's key cannot predate L1's there, for it would still have
been present (L2 is valid later) and n would have refused L1. So n granted L2
when its counter was already >= t1; its fence, hence t2, exceeds t1. ``H`` must hold
granting nodes only, for case (b).

Not covered: a node restarted without persistence (or a failover to a lagging
replica) loses its keys and its counter. The claim holds while N - quorum + 1
nodes of H1 (3 of 5) keep theirs; if restarts take more, a later majority may
avoid every survivor, and only the server-time floor of a node that lost its counter
(whole seconds, as microseconds) keeps fences rising, which holds only while clocks
are sane (no node's clock, and so no fence, ran ahead). As the Redlock paper advises,
keep a restarted node down for one maximum TTL, or run it with ``appendfsync always``.
Exclusion itself rests on bounded clock drift and pauses, as in Redlock; fences are
what a store should check to survive a paused holder.

Without fencing (``fencing=False``) the nodes count nothing and every lease's ``fence``
is 0: such a lease gives exclusion while clocks and pauses behave, and nothing a store
can check (``fenced_update`` would let a paused holder's write through).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from redis import asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from headway._clock import Clock, MonotonicClock
from headway._errors import BackendUnavailable, LockNotAcquired, LockNotOwned
from headway._redis.resp import pack
from headway._redis.scripts import Script
from headway._redis.wire import forget
from headway.lock.backends.redis.keys import (
    EXTEND,
    FENCE_RAISE,
    INSPECT,
    inspect_call,
    lock_keys,
    text,
)
from headway.lock.backends.redlock.nodes import Nodes
from headway.lock.driver import run_to_end
from headway.lock.introspection import Holder, LockState, owner_of
from headway.lock.lease import Lease, _finite_seconds, check_timeout, check_ttl, new_token

__all__ = ["RedlockBackend"]

ACQUIRE = Script("lock/redlock_acquire")
RELEASE = Script("lock/redlock_release", allow_oom=True)  # frees: runs out of memory too


class RedlockBackend:
    """Locks held on a majority of N independent Redis servers (``redis.asyncio`` clients).

    Keeps working with up to (N-1)//2 servers down and grants nothing without a
    majority.

    Args:
        clients: One client per independent Redis server (N of them, N >= 1; 3 or 5
            in practice).
        node_timeout: Bounds each request to one node, in seconds (> 0); default
            0.05. A node slower than that counts as a no.
        drift_factor: Clock drift allowed for, as a fraction of ``ttl`` (0 to < 1): a
            lease is valid ``ttl - elapsed - (ttl * drift_factor + 2 ms)``; default 0.01.
        retry_delay: The ``(low, high)`` range in seconds of the random pause between
            acquire rounds; default ``(0.05, 0.2)``.
        fencing: Count a fencing token on the nodes; default True. False makes every
            lease's ``fence`` 0 (not a token: nothing to give ``fenced_update``), for a
            cheaper lock that excludes only while clocks and pauses behave.
        clock: The monotonic clock of rounds and lease validity; default None:
            ``time.monotonic``.

    Raises:
        ValueError: No client, ``node_timeout`` <= 0, ``drift_factor`` out of range, or a
            ``retry_delay`` that is not a (low, high) range of seconds.
    """

    name = "redlock"

    def __init__(
        self,
        clients: Sequence[aioredis.Redis],
        *,
        node_timeout: float = 0.05,
        drift_factor: float = 0.01,
        retry_delay: tuple[float, float] = (0.05, 0.2),
        fencing: bool = True,
        clock: Clock | None = None,
    ) -> None:
        if not clients:
            raise ValueError("Redlock needs at least one Redis client")
        if _finite_seconds("node_timeout", node_timeout) <= 0:
            raise ValueError(f"node_timeout must be > 0, got {node_timeout!r}")
        if not 0 <= drift_factor < 1:
            raise ValueError(f"drift_factor must be in [0, 1), got {drift_factor!r}")
        low, high = (_finite_seconds("retry_delay", delay) for delay in retry_delay)
        if not 0 <= low <= high:
            raise ValueError(f"retry_delay must be a (low, high) range, got {retry_delay!r}")
        self.clients = list(clients)
        self.node_timeout = node_timeout
        self.drift_factor = drift_factor
        self.retry_delay = (low, high)
        self.fencing = fencing
        self.clock: Clock = clock or MonotonicClock()
        self.quorum = len(self.clients) // 2 + 1
        self._nodes = Nodes(self.clients, node_timeout)
        self._owned = False

    @classmethod
    def from_urls(
        cls,
        urls: Sequence[str],
        *,
        node_timeout: float = 0.05,
        drift_factor: float = 0.01,
        retry_delay: tuple[float, float] = (0.05, 0.2),
        fencing: bool = True,
        clock: Clock | None = None,
        **options: Any,
    ) -> RedlockBackend:
        """Connect to one independent Redis server per URL; ``options`` go to each client.

        Args:
            urls: One ``redis://`` URL per independent server.
            node_timeout: Seconds per request to one node, as for the constructor;
                default 0.05.
            drift_factor: The clock drift allowed for, as for the constructor; default
                0.01.
            retry_delay: The pause between rounds, as for the constructor; default
                ``(0.05, 0.2)``.
            fencing: Count fencing tokens; default True.
            clock: The monotonic clock; default None: ``time.monotonic``.

        Raises:
            ValueError: No URL, ``node_timeout`` <= 0, ``drift_factor`` out of range, or a
                ``retry_delay`` that is not a (low, high) range of seconds.
        """
        # One attempt per node per round: retrying inside a round only eats its validity.
        options.setdefault("retry", Retry(NoBackoff(), 0))
        clients = [aioredis.Redis.from_url(url, **options) for url in urls]
        backend = cls(
            clients,
            node_timeout=node_timeout,
            drift_factor=drift_factor,
            retry_delay=retry_delay,
            fencing=fencing,
            clock=clock,
        )
        backend._owned = True
        return backend

    def _drift(self, ttl_ms: int) -> float:
        return ttl_ms / 1000 * self.drift_factor + 0.002

    async def _release_all(self, resource: str, token: str, fence: int = 0) -> list[Any]:
        k = lock_keys(resource)
        args = pack([token, fence])
        return await self._nodes.everywhere(RELEASE, (k.owner, k.fence), [args] * len(self._nodes))

    async def _round(self, resource: str, ttl_ms: int) -> Lease | str:
        """One acquire round; on failure it is undone everywhere and the reason returned."""
        token = new_token()
        k = lock_keys(resource)
        args = pack([token, ttl_ms, 1 if self.fencing else 0])
        n = len(self._nodes)
        sent = self.clock()
        replies = await self._nodes.everywhere(ACQUIRE, (k.owner, k.fence), [args] * n)
        fences = {i: r for i, r in enumerate(replies) if type(r) is int and r >= 0}
        fence = max(fences.values(), default=0)
        why = f"{len(fences)}/{n} nodes granted it (quorum {self.quorum})"
        if len(fences) >= self.quorum:
            held = await self._settle(resource, token, fences, fence)
            deadline = sent + ttl_ms / 1000 - self._drift(ttl_ms)
            if held is None and self.clock() < deadline:
                return Lease(resource, token, fence, deadline, ttl_ms / 1000)
            if held is None:
                why = "its validity ran out before the quorum answered"
            else:
                why = f"only {held[0]}/{n} nodes confirmed its fence (quorum {self.quorum})"
                replies = held[1]
        await self._release_all(resource, token, fence)
        return why + self._nodes.errors(replies)

    async def _settle(
        self, resource: str, token: str, fences: dict[int, int], fence: int
    ) -> tuple[int, list[Any]] | None:
        """Make a majority of granting nodes count from ``fence``: None when they do, else
        how many confirmed and the replies of the write-back."""
        k = lock_keys(resource)
        agreed = [i for i, f in fences.items() if f == fence]
        if len(agreed) >= self.quorum:  # they counted it in the grant: no write-back round
            if fence:
                self._catch_up(resource, fence, set(agreed))
            return None
        args = pack([fence, token])
        acks = await self._nodes.everywhere(
            FENCE_RAISE, (k.fence, k.owner), [args] * len(self._nodes)
        )
        held = sum(1 for i in fences if acks[i] == 1)
        return None if held >= self.quorum else (held, acks)

    def _catch_up(self, resource: str, fence: int, current: set[int]) -> None:
        # Not needed for the claim (a majority counted ``fence``); raising the others now,
        # unawaited, keeps counters equal so the next round needs no write-back either.
        k = lock_keys(resource)
        args = pack([fence, ""])
        for i, wires in enumerate(self._nodes.wires):
            wire = wires.ready_wire()
            if i not in current and wire is not None:
                forget(wire.submit(FENCE_RAISE, (k.fence, k.owner), args, None, self.node_timeout))

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """Acquire ``resource`` on a majority, retrying for up to ``timeout`` s."""
        ttl_ms = check_ttl(ttl)
        timeout = check_timeout(timeout)
        end = self.clock() + timeout

        async def undo(outcome: Lease | str) -> None:
            if isinstance(outcome, Lease):
                await self._release_all(resource, outcome.token)

        while True:
            outcome = await run_to_end(self._round(resource, ttl_ms), undo)
            if isinstance(outcome, Lease):
                return outcome
            remaining = end - self.clock()
            if remaining <= 0:
                raise LockNotAcquired(
                    f"lock {resource!r} not acquired within {timeout:g} s on Redlock:"
                    f" at the last attempt {outcome}",
                    resource=resource,
                )
            await asyncio.sleep(min(remaining, random.uniform(*self.retry_delay)))

    def _check(self, lease: Lease, replies: Sequence[Any], what: str) -> None:
        """Raise unless a majority confirmed ``what``; LockNotOwned once refusals rule it out."""
        confirmed = sum(1 for r in replies if r == 1)
        if confirmed >= self.quorum:
            return
        message = (
            f"cannot {what} lock {lease.resource!r} (fence {lease.fence}): {confirmed}/"
            f"{len(self.clients)} nodes hold the lease (quorum {self.quorum})"
            + self._nodes.errors(replies)
        )
        unknown = sum(1 for r in replies if isinstance(r, BaseException))
        if confirmed + unknown < self.quorum:
            raise LockNotOwned(message, resource=lease.resource)
        raise BackendUnavailable(message, backend="redlock")

    async def release(self, lease: Lease) -> None:
        """Release ``lease`` on every node; shielded from cancellation."""
        replies = await run_to_end(self._release_all(lease.resource, lease.token))
        self._check(lease, replies, "release")

    async def extend(self, lease: Lease, ttl: float) -> Lease:
        """Renew ``lease`` for ``ttl`` s on a majority; its new validity counts from the send."""
        ttl_ms = check_ttl(ttl)
        keys = lock_keys(lease.resource).extend
        args = pack([lease.token, ttl_ms])
        sent = self.clock()
        replies = await self._nodes.everywhere(EXTEND, keys, [args] * len(self._nodes))
        self._check(lease, replies, "extend")
        deadline = sent + ttl_ms / 1000 - self._drift(ttl_ms)
        if self.clock() >= deadline:
            raise BackendUnavailable(
                f"extending lock {lease.resource!r} took longer than its validity",
                backend="redlock",
            )
        return Lease(lease.resource, lease.token, lease.fence, deadline, ttl_ms / 1000)

    async def inspect(self, resource: str) -> LockState:
        """Who holds ``resource``'s lock: the token a majority of nodes agree on.

        Every node is asked at once (``lock/inspect``, read-only). The holder's fence is
        the highest of its nodes', and its time left the quorum-th longest of their
        leases (the lock is held while a majority holds it). Redlock keeps no line of
        waiters (rounds of SET NX): ``waiting`` is always 0.

        Args:
            resource: The lock's name.

        Raises:
            BackendUnavailable: Fewer nodes than a majority answered.
        """
        keys, args = inspect_call(resource)
        replies = await self._nodes.everywhere(INSPECT, keys, [args] * len(self._nodes))
        answered = [r for r in replies if not isinstance(r, BaseException)]
        if len(answered) < self.quorum:
            raise BackendUnavailable(
                f"cannot tell who holds lock {resource!r}: {len(answered)}/"
                f"{len(self.clients)} nodes answered (quorum {self.quorum})"
                + self._nodes.errors(replies),
                backend="redlock",
            )
        by_token: dict[str, list[tuple[int, int]]] = {}
        for reply in answered:
            if token := text(reply[0]):
                by_token.setdefault(token, []).append((int(reply[1]), int(reply[2])))
        for token, nodes in by_token.items():
            if len(nodes) >= self.quorum:
                left_ms = sorted((pttl for _, pttl in nodes), reverse=True)[self.quorum - 1]
                fence = max(fence for fence, _ in nodes) if self.fencing else 0
                holder = Holder(fence, max(left_ms, 0) / 1000, owner_of(token))
                return LockState(resource, (holder,))
        return LockState(resource)  # free, or a round under way that no majority granted yet

    async def aclose(self) -> None:
        """Close this event loop's connections, and the clients opened by ``from_urls``
        (clients passed in stay the caller's)."""
        await self._nodes.aclose(self._owned)
