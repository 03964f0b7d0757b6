"""The etcd lock backend: etcd's own ``concurrency.Mutex`` recipe over the JSON gateway.

Each acquire owns one etcd lease (its id derived from the lease token) and one key,
``<namespace>lock/<resource>/<lease id>``, created once in a transaction if its
create revision is 0. The key with the lowest create revision under the resource's
prefix holds the lock; its create revision is the fencing token (etcd's revision is
cluster-wide and only grows). A waiter watches only its predecessor's key for a
DELETE (a release, a leave or an expired lease), then looks again: FIFO, no herd.
Renewal is a lease keep-alive; an expired lease has deleted the key, so a refused
keep-alive is a lost lock.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from headway._clock import Clock
from headway._keys import segment
from headway.lock.backends.etcd.codec import FAILED_PRECONDITION, NOT_FOUND, EtcdError, b64, unb64
from headway.lock.backends.etcd.inspect import holders, value
from headway.lock.contract import AsyncWaiter
from headway.lock.driver import QueuedBackend
from headway.lock.flow import Attempt, Try, parse_waiter
from headway.lock.introspection import LockState
from headway.lock.modes import LockMode, ModeKind

if TYPE_CHECKING:
    from headway.lock.backends.etcd.gateway import Gateway
    from headway.lock.backends.etcd.modes import EtcdModeBackend

__all__ = ["EtcdLockBackend"]

#: What a refusal reports as the holder's remaining lease: unknown, and not needed,
#: since the watch also sees the key deleted by an expiry. Waits stay capped by the flow.
_WATCHED_MS = 60_000


def _lease_id(token: str) -> int:
    """The etcd lease id of a lease token: positive, non-zero, 63 bits."""
    digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
    return (int.from_bytes(digest) >> 1) or 1


def _prefix_end(prefix: str) -> str:
    """The range end that covers every key starting with ``prefix`` (which ends in "/")."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class _Waiter:
    """Waits for the predecessor of one waiter's key to be deleted."""

    def __init__(self, backend: EtcdLockBackend, resource: str, token: str) -> None:
        self.backend, self.resource, self.token = backend, resource, token

    async def wait(self, seconds: float) -> int | None:
        backend = self.backend
        revision = backend._revisions.get(self.token)
        if revision is None:
            return None  # no place (yet): the next attempt takes one
        prefix = backend._prefix(self.resource)
        before = await backend._gateway.call(
            "kv/range",
            {
                "key": b64(prefix),
                "range_end": b64(_prefix_end(prefix)),
                "max_create_revision": str(revision - 1),
                "sort_order": "DESCEND",
                "sort_target": "CREATE",
                "limit": "1",
                "keys_only": True,
            },
        )
        kvs = before.get("kvs")
        if not kvs:
            return None  # nobody ahead: the next attempt is granted
        seen = int(before["header"]["revision"])
        await backend._gateway.deleted(unb64(kvs[0]["key"]), seen, seconds)
        return None  # the next attempt looks again (the lock is never handed over)


class EtcdLockBackend(QueuedBackend):
    """Locks on an etcd v3 cluster (3.4 or later), through its JSON gateway (httpx).

    Lease TTLs are whole seconds on etcd, at least its minimum (2 s by default):
    a shorter ``ttl`` is held longer on the server, never shorter than the lease says.

    Offers every mode: ``ReadWriteLock`` and ``Semaphore`` work over it too.

    Args:
        endpoints: The members' client URLs (a list, or one string with commas); a
            member that is down or has no leader is left for the next. Default
            ``"http://127.0.0.1:2379"``.
        timeout: Bounds every call, in seconds: a cluster that cannot answer
            (unreachable, no quorum) raises ``BackendUnavailable`` within it;
            default 2.0.
        namespace: The prefix of every key the locks write; default ``"headway/"``.
        clock: The monotonic clock of lease deadlines and waits; default None:
            ``time.monotonic``.
    """

    name = "etcd"
    modes: frozenset[ModeKind] = frozenset({"read", "write", "permits"})
    #: Where this backend's keys live under the namespace (a mode's family has its own).
    _space = "lock"

    def __init__(
        self,
        endpoints: str | Sequence[str] = "http://127.0.0.1:2379",
        *,
        timeout: float = 2.0,
        namespace: str = "headway/",
        clock: Clock | None = None,
    ) -> None:
        super().__init__(clock)
        if isinstance(endpoints, str):
            endpoints = endpoints.split(",")
        self.namespace = namespace
        # httpx is the ``etcd`` extra's: imported only when a backend is made.
        from headway.lock.backends.etcd.gateway import Gateway

        self._gateway: Gateway = Gateway(endpoints, timeout)
        # token -> the create revision of its key, while it waits or holds.
        self._revisions: dict[str, int] = {}
        # token -> its lease, once ``extend`` moved the key to a longer lease.
        self._moved: dict[str, int] = {}

    @classmethod
    def from_url(cls, url: str, *, timeout: float = 2.0, **options: Any) -> EtcdLockBackend:
        """Connect to ``url``; other keyword arguments go to the constructor.

        Args:
            url: One client URL, or several separated by commas.
            timeout: Bounds every call, in seconds; default 2.0.
        """
        return cls(url.split(","), timeout=timeout, **options)

    def _prefix(self, resource: str) -> str:
        name = segment(resource)
        if "/" in name:  # "a" must not range over the keys of "a/b"
            name = segment("\0" + resource)  # not in the safe alphabet: always a digest
        return f"{self.namespace}{self._space}/{name}/"

    def for_mode(self, mode: LockMode) -> EtcdModeBackend:
        """This backend's locks in ``mode`` (see ``ModalLockBackend.for_mode``): a view
        sharing its connections, so close the backend, not the view."""
        from headway.lock.backends.etcd.modes import EtcdModeBackend

        return EtcdModeBackend(self, mode)

    async def inspect(self, resource: str) -> LockState:
        """Who holds ``resource``'s lock, and how many wait (``InspectableLockBackend``).

        One range over the lock's keys: the oldest holds (its create revision is the
        fence), the others wait; the holder's time left is its etcd lease's, in whole
        seconds.

        Args:
            resource: The lock's name.
        """
        kvs = (await self._gateway.call("kv/range", self._listing(resource, False))).get("kvs")
        if not kvs:
            return LockState(resource)
        return LockState(
            resource, await holders(self._gateway, [(kvs[0], "exclusive")]), len(kvs) - 1
        )

    def _listing(self, resource: str, keys_only: bool) -> dict[str, Any]:
        """A range over ``resource``'s request keys, oldest first."""
        prefix = self._prefix(resource)
        return {
            "key": b64(prefix),
            "range_end": b64(_prefix_end(prefix)),
            "sort_order": "ASCEND",
            "sort_target": "CREATE",
            "keys_only": keys_only,
        }

    def _lease(self, token: str) -> int:
        return self._moved.get(token) or _lease_id(token)

    def _key(self, resource: str, token: str) -> str:
        return f"{self._prefix(resource)}{_lease_id(token):016x}"

    async def _try(self, resource: str, step: Try) -> Attempt:
        lease = self._lease(step.token)
        if step.token in self._revisions:
            # A retry: renew the place (and, if granted now, the lease from here on).
            try:
                alive, reply = await asyncio.gather(
                    self._keepalive(lease), self._place(resource, step.token, lease)
                )
            except EtcdError as exc:
                if exc.code != NOT_FOUND:  # the key was gone, and so was the lease for it
                    raise
                alive = False
            if not alive:  # our lease ran out while we waited: queue again, at the end
                self._forget(step.token)
                return await self._try(resource, step)
        else:
            await self._grant(lease, step.ttl_ms)
            reply = await self._place(resource, step.token, lease)
        mine, owner = (int(r["response_range"]["kvs"][0]["create_revision"]) for r in reply[-2:])
        self._revisions[step.token] = mine
        if owner == mine:
            return Attempt(True, fence=mine)
        if not step.waiter:  # no waiting: take no place
            await self._revoke(step.token)
        return Attempt(False, pttl_ms=_WATCHED_MS)

    async def _place(self, resource: str, token: str, lease: int) -> list[Any]:
        """Create our key if it is missing; return [..., our key, the owner's key]."""
        prefix, key = self._prefix(resource), b64(self._key(resource, token))
        gets = [
            {"request_range": {"key": key, "keys_only": True}},
            {
                "request_range": {
                    "key": b64(prefix),
                    "range_end": b64(_prefix_end(prefix)),
                    "sort_order": "ASCEND",
                    "sort_target": "CREATE",
                    "limit": "1",
                    "keys_only": True,
                }
            },
        ]
        put = {"request_put": {"key": key, "value": b64(value()), "lease": str(lease)}}
        reply = await self._gateway.call(
            "kv/txn",
            {
                "compare": [{"key": key, "target": "CREATE", "result": "EQUAL"}],
                "success": [put, *gets],
                "failure": gets,
            },
        )
        responses: list[Any] = reply["responses"]
        return responses

    async def _grant(self, lease: int, ttl_ms: int) -> None:
        try:
            body = {"ID": str(lease), "TTL": str(math.ceil(ttl_ms / 1000))}
            await self._gateway.call("lease/grant", body)
        except EtcdError as exc:
            # A grant sent again after a lost reply finds its own lease: that is fine.
            if exc.code != FAILED_PRECONDITION:
                raise

    async def _keepalive(self, lease: int) -> bool:
        reply = await self._gateway.call("lease/keepalive", {"ID": str(lease)})
        return int(reply.get("TTL", 0)) > 0

    async def _revoke(self, token: str) -> bool:
        """Revoke ``token``'s lease (deleting its key); False if it was gone."""
        lease = self._lease(token)
        self._forget(token)
        try:
            await self._gateway.call("lease/revoke", {"ID": str(lease)})
        except EtcdError as exc:
            if exc.code != NOT_FOUND:
                raise
            return False
        return True

    def _forget(self, token: str) -> None:
        self._revisions.pop(token, None)
        self._moved.pop(token, None)

    async def _release(self, resource: str, token: str) -> bool:
        return await self._revoke(token)

    async def _extend(self, resource: str, token: str, ttl_ms: int) -> bool:
        lease = self._lease(token)
        reply = await self._gateway.call("lease/keepalive", {"ID": str(lease)})
        granted = int(reply.get("TTL", 0))
        if granted <= 0:
            self._forget(token)
            return False
        if granted * 1000 >= ttl_ms:
            return True
        return await self._move(resource, token, lease, math.ceil(ttl_ms / 1000))

    async def _move(self, resource: str, token: str, lease: int, ttl: int) -> bool:
        """Bind our key to a new, longer lease (a keep-alive cannot change a TTL); the
        key keeps its create revision, so the fence and the place stay."""
        new = secrets.randbits(62) + 1
        await self._gateway.call("lease/grant", {"ID": str(new), "TTL": str(ttl)})
        key = b64(self._key(resource, token))
        reply = await self._gateway.call(
            "kv/txn",
            {
                "compare": [
                    {"key": key, "target": "LEASE", "result": "EQUAL", "lease": str(lease)}
                ],
                "success": [{"request_put": {"key": key, "lease": str(new), "ignore_value": True}}],
            },
        )
        if not reply.get("succeeded"):
            await self._gateway.call("lease/revoke", {"ID": str(new)})
            return False
        self._moved[token] = new
        await self._gateway.call("lease/revoke", {"ID": str(lease)})  # now holds no key
        return True

    async def _leave(self, resource: str, waiter: str) -> None:
        await self._revoke(parse_waiter(waiter)[0])

    def _join(self, resource: str, waiter: str) -> AsyncWaiter | None:
        # Listening costs nothing: each wait looks for the predecessor and watches
        # from the revision it saw, so no release can slip between attempt and wait.
        return _Waiter(self, resource, parse_waiter(waiter)[0])

    async def _listen(self, resource: str, waiter: str) -> AsyncWaiter:
        return _Waiter(self, resource, parse_waiter(waiter)[0])

    async def _unlisten(self, resource: str, waiter: str) -> None:
        return None

    async def aclose(self) -> None:
        """Close the HTTP connections (leases still held run out on the server)."""
        await self._gateway.aclose()
