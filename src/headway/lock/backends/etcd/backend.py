"""The etcd lock backend: etcd's own ``concurrency.Mutex`` recipe, over gRPC or the gateway.

Keys: each acquire puts one key, ``<namespace>lock/<resource>/<id>`` (``<id>``: 16 hex
digits of a hash of the lease token, so a key is one acquire's and says nothing of
the token), its value empty, created once in a transaction if its create revision is
0. The key is bound to the backend's **session lease** for the acquire's TTL in whole
seconds (``session.py``): the lease a key shows is shared by every lock of that
backend with that TTL, kept alive while the process lives, and its TTL is the
session's, not the time the lock has left. The key with the lowest create revision
under the resource's prefix holds the lock; its create revision is the fencing token
(etcd's revision is cluster-wide and only grows); the others wait, in create-revision
order.

Each lock's own TTL is kept by this process: a lease not extended by its deadline has
its key deleted then (its lapse), and a lock's deadline never passes its session's
``expiry``, so a process that stops (SIGSTOP, a crash) loses its locks on the server
within its session's TTL. A waiter watches only its predecessor's key for a DELETE (a
release, a leave, a lapse or an ended session), then looks again: FIFO, no herd, and
nothing to renew while it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from headway._clock import Clock
from headway._keys import segment
from headway.lock.backends.etcd.codec import NOT_FOUND, EtcdError, b64, unb64
from headway.lock.backends.etcd.inspect import holders, value
from headway.lock.backends.etcd.places import Place, Places
from headway.lock.backends.etcd.requests import (
    ahead_of,
    key_id,
    listing,
    newest_two,
    put_once,
    rebind,
)
from headway.lock.backends.etcd.session import Sessions
from headway.lock.backends.etcd.transport import Transport, TransportName, make_transport
from headway.lock.contract import AsyncWaiter
from headway.lock.driver import QueuedBackend
from headway.lock.flow import Attempt, Try, parse_waiter
from headway.lock.introspection import LockState
from headway.lock.modes import LockMode, ModeKind

if TYPE_CHECKING:
    from headway.lock.backends.etcd.modes import EtcdModeBackend

__all__ = ["EtcdLockBackend"]

#: How long a waiter trusts an open watch that has not fired (s) before it looks
#: again: a connection that died without a word cannot hide a release for longer.
_TRUST = 5.0
#: What a refusal reports as the holder's remaining lease: unknown, and not needed,
#: since the watch also sees the key deleted by an expiry. Waits stay capped by the flow.
_WATCHED_MS = 60_000


class Waiter:
    """Waits for the watch of one waiter's predecessor to fire."""

    def __init__(self, backend: EtcdLockBackend, token: str) -> None:
        self.backend, self.token = backend, token

    async def wait(self, seconds: float) -> int | None:
        watch = self.backend._keys.watches.get(self.token)
        if watch is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await watch.gone.wait()
        return None  # the next attempt looks again (the lock is never handed over)


class EtcdLockBackend(QueuedBackend):
    """Locks on an etcd v3 cluster (3.4 or later), through its gRPC API or JSON gateway.

    Every lock of one TTL (in whole seconds) shares one etcd lease, a session kept
    alive in the background, as etcd's ``concurrency`` package does; each lock's own
    ``ttl`` is kept by the backend (a lease not extended lapses at its deadline), and
    if the process stops, its locks end on the server within their TTL rounded up to
    whole seconds, at least etcd's minimum (2 s by default).

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
        transport: How to reach etcd: ``"grpc"`` (its gRPC API, through grpcio),
            ``"gateway"`` (its v3 JSON gateway, through httpx), or ``"auto"`` (the
            default): gRPC if grpcio is installed (the ``etcd`` extra installs both),
            else the gateway. A gRPC call takes about half the time.
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
        transport: TransportName = "auto",
    ) -> None:
        super().__init__(clock)
        if isinstance(endpoints, str):
            endpoints = endpoints.split(",")
        self.namespace = namespace
        self._gateway: Transport = make_transport(transport, endpoints, timeout)
        self._keys = Places(self._gateway, self.clock)
        self._sessions = Sessions(self._gateway, self.clock, self._keys.lost)

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

    def _key(self, resource: str, token: str) -> str:
        return f"{self._prefix(resource)}{key_id(token):016x}"

    async def inspect(self, resource: str) -> LockState:
        """Who holds ``resource``'s lock, and how many wait (``InspectableLockBackend``).

        One range over the lock's keys: the oldest holds (its create revision is the
        fence), the others wait; the holder's time left is its session lease's, in
        whole seconds (the latest its lock ends if its process stops).

        Args:
            resource: The lock's name.
        """
        reply = await self._gateway.call("kv/range", listing(self._prefix(resource), False))
        kvs = reply.get("kvs")
        if not kvs:
            return LockState(resource)
        return LockState(
            resource, await holders(self._gateway, [(kvs[0], "exclusive")]), len(kvs) - 1
        )

    # -- places: a key under a session, its lapse ------------------------------------

    async def _place(self, resource: str, token: str, ttl_ms: int) -> Place:
        """A new place for ``token`` (its key is not put yet), under the session of its TTL."""
        session = await self._sessions.get(math.ceil(ttl_ms / 1000), token)
        return self._keys.new(token, self._key(resource, token), session)

    # -- the primitives ------------------------------------------------------------------

    async def _try(self, resource: str, step: Try) -> Attempt:
        try:
            return await self._step(resource, step)
        except Exception:
            # The key may be in place (a reply lost in an outage): a key left under a
            # live session would never go, so it is deleted in the background.
            self._keys.abandon(step.token)
            raise

    async def _step(self, resource: str, step: Try) -> Attempt:
        sent = self.clock()
        place = self._keys.places.get(step.token)
        if place is not None and not place.session.alive():
            self._keys.forget(step.token)  # its session ended while it waited: queue again
            place = None
        until = sent + step.ttl_ms / 1000
        try:
            if place is None:
                place = await self._place(resource, step.token, step.ttl_ms)
                covered, found = await asyncio.gather(
                    place.session.cover(until), self._put(resource, place)
                )
            else:
                covered, found = await asyncio.gather(
                    place.session.cover(until), self._ahead(resource, place)
                )
        except EtcdError as exc:
            if exc.code != NOT_FOUND or place is None:  # not "requested lease not found"
                raise
            place.session.lose()
            found = None
        if found is None or not covered:  # our key or its session is gone: queue again
            self._keys.forget(step.token)
            return await self._step(resource, step)
        before, seen = found
        if before is None:
            self._keys.hold(step.token, place, sent)
            return Attempt(True, fence=place.revision)
        if not step.waiter:  # no waiting: take no place
            await self._keys.drop(step.token)
        else:
            self._keys.watch(step.token, self._gateway.deleted(before, seen, None))
        return Attempt(False, pttl_ms=_WATCHED_MS)

    async def _put(self, resource: str, place: Place) -> tuple[str | None, int] | None:
        """Put our key unless a lost reply's attempt did, and note its create revision;
        then as ``_ahead``."""
        # Just put, ours is the newest key: the newest two are ours and the one before
        # it, if there is one. Found instead, ours is looked up.
        newest, ours = (
            newest_two(self._prefix(resource)),
            {"key": b64(place.key), "keys_only": True},
        )
        put = put_once(place.key, value(), place.session.lease, newest, ours)
        reply = await self._gateway.call("kv/txn", put)
        seen = int(reply["header"]["revision"])
        if not reply.get("succeeded"):  # a retry after a lost reply: look it up
            kvs = reply["responses"][0]["response_range"].get("kvs")
            if not kvs:
                return None
            place.revision = int(kvs[0]["create_revision"])
            return await self._ahead(resource, place)
        place.revision = seen  # the put's revision: our key's create revision
        newest = reply["responses"][1]["response_range"]["kvs"]
        return (unb64(newest[1]["key"]) if len(newest) > 1 else None), seen

    async def _ahead(self, resource: str, place: Place) -> tuple[str | None, int] | None:
        """The key just before ours (None if ours is first) and the revision read at;
        None if our key is gone."""
        look = ahead_of(self._prefix(resource), place.key, place.revision)
        reply = await self._gateway.call("kv/txn", look)
        if not reply.get("succeeded"):
            return None
        kvs = reply["responses"][0]["response_range"].get("kvs")
        return (unb64(kvs[0]["key"]) if kvs else None), int(reply["header"]["revision"])

    def _ride(self, resource: str, step: Try) -> Attempt | None:
        # A waiter whose predecessor's watch has not fired is still refused: no I/O, so
        # the driver's capped waits cost nothing (the key needs no renewal: its session
        # is kept alive in the background).
        watch = self._keys.watches.get(step.token)
        place = self._keys.places.get(step.token)
        if watch is None or watch.gone.is_set() or place is None or not place.session.alive():
            return None
        if self.clock() - watch.opened > _TRUST:
            return None
        return Attempt(False, pttl_ms=_WATCHED_MS)

    async def _release(self, resource: str, token: str) -> bool:
        return await self._keys.drop(token)

    async def _extend(self, resource: str, token: str, ttl_ms: int) -> bool:
        sent = self.clock()
        place = self._keys.places.get(token)
        if place is None or not place.session.alive():
            self._keys.forget(token)
            return False
        if math.ceil(ttl_ms / 1000) > place.session.ttl and not await self._move(
            resource, token, place, ttl_ms
        ):
            return False
        if not await place.session.cover(sent + ttl_ms / 1000):
            self._keys.forget(token)
            return False
        self._keys.hold(token, place, sent)
        return True

    async def _move(self, resource: str, token: str, place: Place, ttl_ms: int) -> bool:
        """Bind our key to the longer session of ``ttl_ms`` (a lease's TTL cannot change);
        the key keeps its create revision, so the fence and the place stay."""
        old = place.session
        new = await self._sessions.get(math.ceil(ttl_ms / 1000), token)
        reply = await self._gateway.call("kv/txn", rebind(place.key, old.lease, new.lease))
        if not reply.get("succeeded"):
            new.tokens.discard(token)
            self._keys.forget(token)
            return False
        old.tokens.discard(token)
        place.session = new
        return True

    async def _leave(self, resource: str, waiter: str) -> None:
        await self._keys.drop(parse_waiter(waiter)[0])

    def _join(self, resource: str, waiter: str) -> AsyncWaiter | None:
        # Listening costs nothing: the watch is opened by the attempt that was refused,
        # from the revision it read, so no release can slip between attempt and wait.
        return Waiter(self, parse_waiter(waiter)[0])

    async def _listen(self, resource: str, waiter: str) -> AsyncWaiter:
        return Waiter(self, parse_waiter(waiter)[0])

    async def _unlisten(self, resource: str, waiter: str) -> None:
        return None

    async def aclose(self) -> None:
        """Close the connections. A session that holds no lock is revoked; one that
        still holds one is renewed once and left to run out on the server, so a lock
        still held outlives the process by at least what was left of its lease (as a
        lease of its own would), at most its TTL; a wait still open is given up."""
        held, waiting = self._keys.close()
        try:
            deletes = (self._gateway.call("kv/deleterange", {"key": b64(key)}) for key in waiting)
            await asyncio.gather(*deletes, return_exceptions=True)
            await self._sessions.aclose(keep=held)
        finally:
            await self._gateway.aclose()
