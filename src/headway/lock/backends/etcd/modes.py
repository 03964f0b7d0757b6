"""Read-write locks and semaphores on etcd: the create-revision queue, weighted.

Each request of a family ("rw" or "permits", ``LockMode.family``) on a resource puts one
key, bound to its session lease as an exclusive acquire's is (``backend.py``), under
``<namespace><family>/<resource>/``: ``r/<id>`` for a reader, ``w/<id>`` for a writer,
``p/<id>`` for a permit, whose value is the permits its acquire asked for; ``<id>`` as
in an exclusive lock's key. The queue is those keys in create-revision order, holders
and waiters alike; a request is granted when ``modes.fits`` holds for the weights of the
keys before it, in the family's capacity (a semaphore's: the value of the newest key, so
the newest acquire's). Its fence is its key's create revision: unique, and rising in
queue order, so a writer's exceeds every earlier holder's, a reader's every earlier
writer's.

A refused waiter watches only what it waits for: a reader the last writer before
it, a writer the key just before it, a permit every key of the family (any delete
may free a place: each one is looked at again), with one watch kept open while it
waits. A lapse or an ended session deletes its key, so a crashed holder's place
comes back on the server.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from headway.lock.backends.etcd.backend import _WATCHED_MS, EtcdLockBackend
from headway.lock.backends.etcd.codec import NOT_FOUND, EtcdError, b64, unb64
from headway.lock.backends.etcd.inspect import holders, parse_value, value
from headway.lock.backends.etcd.places import Place
from headway.lock.backends.etcd.requests import key_id, listing, prefix_end, put_once
from headway.lock.driver import QueuedBackend
from headway.lock.flow import Attempt, Try
from headway.lock.introspection import HolderMode, LockState
from headway.lock.modes import WHOLE, LockMode, fits

__all__ = ["EtcdModeBackend"]

#: A request's key, under the family's prefix, starts with its mode's tag.
_TAGS = {"read": "r", "write": "w", "permits": "p"}
#: What ``inspect`` calls the holder of a key with each tag.
_KINDS: dict[str, HolderMode] = {"r": "read", "w": "write", "p": "permits"}
#: A key whose delete wakes permit waiters (no request's: ``_parse`` skips it).
_NUDGE = "~"


@dataclass(frozen=True, slots=True)
class _Request:
    """One key of the queue."""

    key: str
    revision: int  # its create revision: its place, and its fence once granted
    weight: int
    capacity: int  # the permits its acquire asked for (WHOLE for readers and writers)


@dataclass(frozen=True, slots=True)
class _Queue:
    """A family's keys, oldest first, as etcd had them at ``revision``."""

    requests: list[_Request]
    revision: int

    def find(self, revision: int) -> _Request | None:
        return next((r for r in self.requests if r.revision == revision), None)


class EtcdModeBackend(EtcdLockBackend):
    """An ``EtcdLockBackend`` holding resources in one ``LockMode`` (``for_mode``)."""

    def __init__(self, backend: EtcdLockBackend, mode: LockMode) -> None:
        # A view, not a client: the backend's connections, sessions and places, so a
        # lease of one view is released or extended through any other.
        QueuedBackend.__init__(self, backend.clock)
        self.namespace = backend.namespace
        self._gateway = backend._gateway
        self._sessions = backend._sessions
        self._keys = backend._keys
        self.mode = mode
        self._space = mode.family

    def _key(self, resource: str, token: str) -> str:
        return f"{self._prefix(resource)}{_TAGS[self.mode.kind]}/{key_id(token):016x}"

    async def _step(self, resource: str, step: Try) -> Attempt:
        sent = self.clock()
        until = sent + step.ttl_ms / 1000
        place = self._keys.places.get(step.token)
        if place is not None and not place.session.alive():
            self._keys.forget(step.token)  # its session ended while it waited: queue again
            place = None
        try:
            if place is None:
                place = await self._place(resource, step.token, step.ttl_ms)
                covered, queue = await asyncio.gather(
                    place.session.cover(until), self._enter(resource, place)
                )
                found = next((r for r in queue.requests if r.key == place.key), None)
                if found is not None and self.mode.kind == "permits":
                    await self._nudge(resource, queue, found, place.session.lease)
            else:
                covered, queue = await asyncio.gather(
                    place.session.cover(until), self._queue(resource)
                )
                found = queue.find(place.revision)
        except EtcdError as exc:
            if exc.code != NOT_FOUND or place is None:  # not "requested lease not found"
                raise
            place.session.lose()
            found = None
        if found is None or not covered:  # our key or its session is gone: queue again
            self._keys.forget(step.token)
            return await self._step(resource, step)
        place.revision = found.revision
        watch = self._blocker(queue, found)
        if watch is None:
            self._keys.hold(step.token, place, sent)
            return Attempt(True, fence=found.revision)
        if not step.waiter:  # no waiting: take no place
            await self._keys.drop(step.token)
        else:
            self._keys.unwatch(step.token)
            self._keys.watch(step.token, self._watching(resource, step.token, watch, queue))
        return Attempt(False, pttl_ms=_WATCHED_MS)

    def _watching(
        self, resource: str, token: str, key: str, queue: _Queue
    ) -> Coroutine[Any, Any, None]:
        """The watch for what keeps ``token`` out: ``key``'s delete, or ("") any delete in
        the family (a permit: any release may free a place) while it still does not fit."""
        if key:
            return self._gateway.deleted(key, queue.revision, None)
        prefix = self._prefix(resource)
        refused = functools.partial(self._refused, resource, token)
        return self._gateway.deleted(
            prefix, queue.revision, None, range_end=prefix_end(prefix), still=refused
        )

    def _blocker(self, queue: _Queue, mine: _Request) -> str | None:
        """None if ``mine`` fits behind the requests before it, else the key to watch
        ("": any key of the family)."""
        ahead = [r for r in queue.requests if r.revision < mine.revision]
        # A semaphore's capacity is the newest acquire's; a read-write lock's is WHOLE.
        capacity = queue.requests[-1].capacity
        if fits((), (r.weight for r in ahead), self.mode.weight, capacity):
            return None
        if self.mode.kind == "permits":
            return ""
        if self.mode.kind == "read":  # only a writer keeps a reader out
            ahead = [r for r in ahead if r.weight == WHOLE] or ahead
        return ahead[-1].key

    async def _nudge(self, resource: str, queue: _Queue, mine: _Request, lease: int) -> None:
        """Wake the permit waiters ahead of ``mine`` that its raised capacity lets in:
        they watch for deletes, so put a key and delete it."""
        ahead = [r for r in queue.requests if r.revision < mine.revision]
        # The request at place i (i before it) fits in i + 1 permits: those at places
        # from the old capacity up to the new one were kept out, and now fit.
        if not ahead or ahead[-1].capacity >= min(mine.capacity, len(ahead)):
            return
        key = b64(self._prefix(resource) + _NUDGE)
        put = {"key": key, "lease": str(lease)}  # bound to our lease: a crash leaves nothing
        await self._gateway.call("kv/put", put)
        await self._gateway.call("kv/deleterange", {"key": key})

    async def _enter(self, resource: str, place: Place) -> _Queue:
        """Put our key (unless a lost reply's attempt did) and read the queue with it."""
        key, lease = place.key, place.session.lease
        needed = str(self.mode.capacity) if self.mode.kind == "permits" else ""
        read = listing(self._prefix(resource), self.mode.kind != "permits")
        reply = await self._gateway.call("kv/txn", put_once(key, value(needed), lease, read))
        return self._parse(resource, reply["responses"][-1]["response_range"], reply)

    async def _queue(self, resource: str) -> _Queue:
        keys_only = self.mode.kind != "permits"
        reply = await self._gateway.call("kv/range", listing(self._prefix(resource), keys_only))
        return self._parse(resource, reply, reply)

    def _parse(self, resource: str, listing: dict[str, Any], reply: dict[str, Any]) -> _Queue:
        skip = len(self._prefix(resource))
        requests = []
        for kv in listing.get("kvs", []):
            key = unb64(kv["key"])
            if key[skip] == _NUDGE:
                continue
            needed = parse_value(unb64(kv["value"]))[0] if kv.get("value") else ""
            capacity = int(needed) if needed else WHOLE
            weight = WHOLE if key[skip] == _TAGS["write"] else 1
            requests.append(_Request(key, int(kv["create_revision"]), weight, capacity))
        return _Queue(requests, int(reply["header"]["revision"]))

    async def inspect(self, resource: str) -> LockState:
        """The holders of ``resource`` in this mode's family, and how many wait.

        The queue's requests that fit behind those before them hold (``modes.fits``,
        as an attempt decides); the others wait.

        Args:
            resource: The lock's name.
        """
        keys = await self._gateway.call("kv/range", listing(self._prefix(resource), False))
        queue = self._parse(resource, keys, keys)
        kvs = {unb64(kv["key"]): kv for kv in keys.get("kvs", [])}
        skip = len(self._prefix(resource))
        line = queue.requests
        capacity = line[-1].capacity if line else WHOLE  # the newest acquire's
        held = [
            r
            for i, r in enumerate(line)
            if fits((), (a.weight for a in line[:i]), r.weight, capacity)
        ]
        found = await holders(self._gateway, [(kvs[r.key], _KINDS[r.key[skip]]) for r in held])
        return LockState(resource, found, len(queue.requests) - len(held))

    async def _refused(self, resource: str, token: str) -> bool:
        """True if ``token``'s request is still in the queue and still does not fit."""
        place = self._keys.places.get(token)
        if place is None:
            return False
        queue = await self._queue(resource)
        found = queue.find(place.revision)
        return found is not None and self._blocker(queue, found) is not None

    async def aclose(self) -> None:
        """Nothing: a view's connections are its backend's, closed with it."""
