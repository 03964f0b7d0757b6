"""Redlock: one lock over N independent Redis servers, held while a majority holds it.

Every operation is sent to all nodes at once, each bounded by ``node_timeout``;
a node that fails or does not answer in time counts as a no. An acquire round
is granted by a majority (N//2+1) of nodes; its lease is valid until the first
send + ``ttl - drift`` (``drift = ttl * drift_factor + 2 ms``), so it has
``ttl - elapsed - drift`` left when granted, and must have some. A round
that falls short is undone on every node, answering or not, and retried after
a random delay until the timeout. Rounds never queue: each node sees single
attempts (``lock/acquire`` with no waiter), and each round has a fresh token,
so a late release from an old round can never remove a newer round's key.

Fencing across node failures
----------------------------
Each granting node returns its own fence (INCR, floored by its clock in
microseconds); the lease's fence ``t`` is the highest of them. Before the lease
is returned, a write-back round (``lock/fence_raise``) raises every node's
counter to at least ``t``, and the lease is granted only if a majority of nodes
*that granted it* confirm, still holding the key: call that set ``H``.

Claim: a lease L2 granted after L1 was returned has ``t2 > t1``. L2 needs a
majority M2, which meets H1 in some node n. At n, L2's acquire ran after the
write-back: (a) trivially if L2's round started after L1 was returned; (b) if
the round overlapped, n held L1's key from L1's acquire until L1 released it or
it expired, both after L1 was returned (keys outlive validity: Redlock's own
clock assumption). L2's key cannot predate L1's there, for it would still have
been present (L2 is valid later) and n would have refused L1. So n granted L2
after the write-back, when its counter was already >= t1; its fence, hence t2,
exceeds t1. Confirmations must come from granting nodes for case (b).

Not covered: a node restarted without persistence (or a failover to a lagging
replica) loses its keys and its counter. The claim holds while N - quorum + 1
nodes of H1 (3 of 5) keep theirs; if restarts take more, a later majority may
avoid every survivor, and only the server-time floor keeps
fences rising, which holds only while clocks are sane (no node's clock, and so
no fence, ran ahead). As the Redlock paper advises, keep a restarted node down
for one maximum TTL, or run it with ``appendfsync always``. Exclusion itself
rests on bounded clock drift and pauses, as in Redlock; fences are what a
store should check to survive a paused holder.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis import asyncio as aioredis
from redis import exceptions as redis_errors
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from headway._clock import Clock, MonotonicClock
from headway._errors import BackendUnavailable, LockNotAcquired, LockNotOwned
from headway._redis.errors import UNAVAILABLE
from headway.lock.backends.redis.keys import (
    ACQUIRE,
    EXTEND,
    FENCE_RAISE,
    RELEASE,
    acquire_call,
    lock_keys,
    release_call,
)
from headway.lock.driver import complete
from headway.lock.flow import Attempt, Try
from headway.lock.lease import Lease, _finite_seconds, check_timeout, check_ttl, new_token

__all__ = ["RedlockBackend"]

#: A node that answers with an error (out of memory, read-only replica) is a no, like one that
#: does not answer; a bad argument on our side (DataError) is a bug and propagates.
_NODE_ERRORS: tuple[type[BaseException], ...] = (*UNAVAILABLE, redis_errors.ResponseError)

Call = Callable[[Any], Awaitable[Any]]


def _label(index: int, client: Any) -> str:
    try:
        kwargs = client.connection_pool.connection_kwargs
    except AttributeError:
        return f"node {index}"
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


class RedlockBackend:
    """Locks held on a majority of N independent Redis servers (``redis.asyncio`` clients).

    Keeps working with up to (N-1)//2 servers down and grants nothing without a
    majority. ``node_timeout`` bounds each request to one node (seconds);
    ``retry_delay`` is the random range between acquire rounds.
    """

    name = "redlock"

    def __init__(
        self,
        clients: Sequence[aioredis.Redis],
        *,
        node_timeout: float = 0.05,
        drift_factor: float = 0.01,
        retry_delay: tuple[float, float] = (0.05, 0.2),
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
        self.clock: Clock = clock or MonotonicClock()
        self.quorum = len(self.clients) // 2 + 1
        self._labels = [_label(i, client) for i, client in enumerate(self.clients)]
        self._owned = False

    @classmethod
    def from_urls(
        cls,
        urls: Sequence[str],
        *,
        node_timeout: float = 0.05,
        drift_factor: float = 0.01,
        retry_delay: tuple[float, float] = (0.05, 0.2),
        clock: Clock | None = None,
        **options: Any,
    ) -> RedlockBackend:
        """Connect to one independent Redis server per URL; ``options`` go to each client."""
        # One attempt per node per round: retrying inside a round only eats its validity.
        options.setdefault("retry", Retry(NoBackoff(), 0))
        clients = [aioredis.Redis.from_url(url, **options) for url in urls]
        backend = cls(
            clients,
            node_timeout=node_timeout,
            drift_factor=drift_factor,
            retry_delay=retry_delay,
            clock=clock,
        )
        backend._owned = True
        return backend

    def _drift(self, ttl_ms: int) -> float:
        return ttl_ms / 1000 * self.drift_factor + 0.002

    async def _node(self, client: Any, call: Call) -> Any:
        try:
            async with asyncio.timeout(self.node_timeout):
                return await call(client)
        except _NODE_ERRORS as exc:
            return exc

    async def _everywhere(self, call: Call) -> list[Any]:
        """One reply per node, in node order: the result, or the exception that made it a no."""
        return list(await asyncio.gather(*(self._node(c, call) for c in self.clients)))

    def _errors(self, replies: Sequence[Any]) -> str:
        failed = [
            f"{label}: {self._describe(r)}"
            for label, r in zip(self._labels, replies, strict=True)
            if isinstance(r, BaseException)
        ]
        return "; node errors: " + "; ".join(failed) if failed else ""

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, TimeoutError) and not str(exc):
            return f"no answer within {self.node_timeout:g} s"
        return f"{type(exc).__name__}: {exc}"

    async def _release_all(self, resource: str, token: str) -> list[Any]:
        keys, args = release_call(resource, token)
        return await self._everywhere(lambda c: RELEASE.run(c, keys, args))

    async def _round(self, resource: str, ttl_ms: int) -> Lease | str:
        """One acquire round; on failure it is undone everywhere and the reason returned."""
        token = new_token()
        keys, args = acquire_call(resource, Try(token, ttl_ms, "", 0))
        sent = self.clock()
        replies = await self._everywhere(lambda c: ACQUIRE.run(c, keys, args))
        attempts = {
            i: Attempt.from_reply(r) for i, r in enumerate(replies) if not isinstance(r, Exception)
        }
        fences = {i: attempt.fence for i, attempt in attempts.items() if attempt.granted}
        why = f"{len(fences)}/{len(self.clients)} nodes granted it (quorum {self.quorum})"
        if len(fences) >= self.quorum:
            fence = max(fences.values())
            k = lock_keys(resource)
            acks = await self._everywhere(
                lambda c: FENCE_RAISE.run(c, [k.fence, k.owner], [fence, token])
            )
            held = sum(1 for i in fences if acks[i] == 1)
            deadline = sent + ttl_ms / 1000 - self._drift(ttl_ms)
            if held >= self.quorum and self.clock() < deadline:
                return Lease(resource, token, fence, deadline, ttl_ms / 1000)
            why = (
                f"only {held}/{len(self.clients)} nodes confirmed its fence (quorum {self.quorum})"
                if held < self.quorum
                else "its validity ran out before the quorum answered"
            )
            replies = acks
        await self._release_all(resource, token)
        return why + self._errors(replies)

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """Acquire ``resource`` on a majority, retrying for up to ``timeout`` s."""
        ttl_ms = check_ttl(ttl)
        timeout = check_timeout(timeout)
        end = self.clock() + timeout

        async def undo(outcome: Lease | str) -> None:
            if isinstance(outcome, Lease):
                await self._release_all(resource, outcome.token)

        while True:
            outcome = await complete(self._round(resource, ttl_ms), undo)
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
            + self._errors(replies)
        )
        unknown = sum(1 for r in replies if isinstance(r, BaseException))
        if confirmed + unknown < self.quorum:
            raise LockNotOwned(message, resource=lease.resource)
        raise BackendUnavailable(message, backend="redlock")

    async def release(self, lease: Lease) -> None:
        """Release ``lease`` on every node; shielded from cancellation."""
        replies = await complete(self._release_all(lease.resource, lease.token))
        self._check(lease, replies, "release")

    async def extend(self, lease: Lease, ttl: float) -> Lease:
        """Renew ``lease`` for ``ttl`` s on a majority; its new validity counts from the send."""
        ttl_ms = check_ttl(ttl)
        keys = [lock_keys(lease.resource).owner]
        sent = self.clock()
        replies = await self._everywhere(lambda c: EXTEND.run(c, keys, [lease.token, ttl_ms]))
        self._check(lease, replies, "extend")
        deadline = sent + ttl_ms / 1000 - self._drift(ttl_ms)
        if self.clock() >= deadline:
            raise BackendUnavailable(
                f"extending lock {lease.resource!r} took longer than its validity",
                backend="redlock",
            )
        return Lease(lease.resource, lease.token, lease.fence, deadline, ttl_ms / 1000)

    async def aclose(self) -> None:
        """Close the clients opened by ``from_urls`` (clients passed in stay the caller's)."""
        if self._owned:
            for client in self.clients:
                with contextlib.suppress(*UNAVAILABLE):
                    await client.aclose()
