"""The Redis lock backend (single node or Cluster), async and sync shells.

Both shells build keys and arguments with the same pure helpers and run the
same scripts; they differ only in how they wait. Each backend shares one
pub/sub connection among all its waiting tasks (async) or threads (sync,
``_sync_waker``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import secrets
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis
from redis import asyncio as aioredis

from headway._clock import Clock, within
from headway._errors import BackendUnavailable
from headway._keys import tagged
from headway._redis.errors import UNAVAILABLE, unavailable
from headway._redis.scripts import Script
from headway._redis.wire import SyncWire, Wires, forget
from headway.lock.backend import QueuedBackend, SyncQueuedBackend, complete
from headway.lock.backends.redis.sync_waker import SyncWaker
from headway.lock.flow import (
    PLACE_MS,
    WAIT_CAP,
    Attempt,
    Try,
    Wake,
    parse_waiter,
    parse_wake,
    waiter_id,
)
from headway.lock.lease import Lease, check_timeout, check_ttl, new_token

__all__ = ["RedisLockBackend", "SyncRedisLockBackend"]

log = logging.getLogger("headway.lock")

T = TypeVar("T")

ACQUIRE = Script("lock_acquire", include=("lock_handoff",))
RELEASE = Script("lock_release", include=("lock_handoff",))
EXTEND = Script("lock_extend")
LEAVE = Script("lock_leave", include=("lock_handoff",))


@dataclass(frozen=True, slots=True)
class _Keys:
    owner: str
    fence: str
    queue: str
    places: str
    released: str
    channel: str
    # What each script is called with (tuples: the pipelined connection packs them once).
    acquire: tuple[str, ...] = ()
    release: tuple[str, ...] = ()
    leave: tuple[str, ...] = ()
    extend: tuple[str, ...] = ()


@functools.lru_cache(maxsize=4096)
def lock_keys(resource: str) -> _Keys:
    """The keys (and wake-up channel) of one lock, all under one hash tag."""
    parts = ("owner", "fence", "queue", "places", "released", "wake")
    owner, fence, queue, places, released, channel = tagged("lock", resource, *parts)
    return _Keys(
        owner,
        fence,
        queue,
        places,
        released,
        channel,
        acquire=(owner, fence, queue, places),
        release=(owner, queue, places, released, fence),
        leave=(owner, queue, places, fence),
        extend=(owner,),
    )


def release_call(
    resource: str,
    token: str,
    node: str = "",
    retried: bool = True,
    riders: Sequence[str] = (),
) -> tuple[tuple[str, ...], list[Any]]:
    """Keys and arguments of one ``lock_release`` call.

    ``node`` names the releasing client: its own waiters are handed the lock without
    a message on the channel, as it tells them itself. A client that may send the
    call again (``retried``: redis-py retries) gives it an id, so the script can
    recognise the repeat. ``riders`` are waiter ids the release queues (see
    ``RedisLockBackend``).
    """
    k = lock_keys(resource)
    call = secrets.token_hex(8) if retried else ""
    queue = (PLACE_MS, *riders) if riders else ()
    return k.release, [token, k.channel, call, node, *queue]


def handed_to(reply: Any) -> tuple[str, int] | None:
    """The waiter and fence a ``lock_release`` reply handed the lock to, if any."""
    if isinstance(reply, list):  # {1, waiter, fence}; a plain 1 or 0 otherwise
        return _text(reply[1]), int(reply[2])
    return None


def leave_call(resource: str, waiter: str) -> tuple[tuple[str, ...], list[Any]]:
    """Keys and arguments of one ``lock_leave`` call."""
    k = lock_keys(resource)
    return k.leave, [waiter, k.channel]


def acquire_call(resource: str, step: Try, floor: int = 0) -> tuple[tuple[str, ...], list[Any]]:
    """Keys and arguments of ``lock_acquire`` for one attempt."""
    k = lock_keys(resource)
    return k.acquire, [
        step.token,
        step.ttl_ms,
        step.waiter,
        step.place_ms,
        floor,
        k.channel,
    ]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _EventWaiter:
    def __init__(self, wake: Wake[asyncio.Event]) -> None:
        self.wake = wake

    async def wait(self, seconds: float) -> int | None:
        if not self.wake.event.is_set():
            with contextlib.suppress(TimeoutError):
                await within(seconds, self.wake.event.wait())
        self.wake.event.clear()
        return self.wake.fence


@dataclass
class _Channel:
    subscribed: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: dict[str, Wake[asyncio.Event]] = field(default_factory=dict)


class _Waker:
    """One pub/sub connection that routes wake-ups to the tasks waiting for them."""

    def __init__(self, client: Any, timeout: float) -> None:
        self._client = client
        self._timeout = timeout
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._channels: dict[str, _Channel] = {}
        # redis-py's pub/sub (the Cluster one above all) is not safe for concurrent
        # commands while it connects: one SUBSCRIBE or UNSUBSCRIBE at a time.
        self._commands = asyncio.Lock()

    def ready(self, channel: str) -> bool:
        """True if ``channel`` is subscribed already: a new listener then costs no I/O."""
        state = self._channels.get(channel)
        return state is not None and state.subscribed.is_set()

    @contextlib.asynccontextmanager
    async def listen(self, channel: str, waiter: str) -> AsyncIterator[_EventWaiter]:
        state = self._channels.get(channel)
        fresh = state is None
        if state is None:
            state = self._channels[channel] = _Channel()
        wake = state.waiters[waiter] = Wake(asyncio.Event())
        try:
            if fresh:
                await self._subscribe(channel, state)
            # A wait is bounded anyway, so a slow confirmation only costs latency.
            if not state.subscribed.is_set() and self._channels.get(channel) is state:
                with contextlib.suppress(TimeoutError):
                    await within(self._timeout, state.subscribed.wait())
            yield _EventWaiter(wake)
        finally:
            del state.waiters[waiter]
            await self._drop_if_idle(channel, state)

    def join(self, channel: str, waiter: str) -> _EventWaiter | None:
        """Listen as ``listen`` does, if that costs no I/O (``channel`` is subscribed);
        else None. ``part`` ends it."""
        state = self._channels.get(channel)
        if state is None or not state.subscribed.is_set():
            return None
        wake = state.waiters[waiter] = Wake(asyncio.Event())
        return _EventWaiter(wake)

    async def part(self, channel: str, waiter: str) -> None:
        """Stop listening for ``waiter`` after ``join``."""
        state = self._channels.get(channel)
        if state is not None and state.waiters.pop(waiter, None) is not None:
            await self._drop_if_idle(channel, state)

    def hand(self, channel: str, waiter: str, fence: int | None) -> None:
        """Tell a waiter of ours that it was handed the lock (before the message comes),
        or, with no fence, that it should try again."""
        state = self._channels.get(channel)
        wake = state.waiters.get(waiter) if state is not None else None
        if wake is not None:
            wake.set(fence)

    async def _drop_if_idle(self, channel: str, state: _Channel) -> None:
        # An unconfirmed subscription is kept until the reader sees its confirmation,
        # so a later subscription to the channel can never be confirmed by this one's.
        if (
            state.waiters
            or not state.subscribed.is_set()
            or self._channels.get(channel) is not state
        ):
            return
        del self._channels[channel]
        with contextlib.suppress(*UNAVAILABLE):
            async with self._commands:
                await self._pubsub.unsubscribe(channel)

    async def _subscribe(self, channel: str, state: _Channel) -> None:
        sent = False
        try:
            if self._pubsub is None:
                self._pubsub = self._client.pubsub()
            async with asyncio.timeout(self._timeout), self._commands:
                await self._pubsub.subscribe(channel)
            sent = True
        except UNAVAILABLE:
            pass  # waits are bounded, and the next attempt reports the outage
        except Exception:
            # Wake-ups are an optimisation over bounded waits: a client bug must not
            # fail the acquire, so its listeners wait out their bounds instead.
            log.exception("subscribing to %s failed; waiting without wake-ups", channel)
        finally:
            # Not subscribed, or not known to be (cancelled): this state's listeners
            # wait alone, and the next listener subscribes afresh.
            if not sent and self._channels.get(channel) is state:
                del self._channels[channel]
        if sent and (self._reader is None or self._reader.done()):
            self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        while True:
            try:
                message = await self._pubsub.get_message(timeout=1.0)
            except UNAVAILABLE:
                # Wake everybody: each retries (and sees the outage) instead of idling.
                for state in self._channels.values():
                    for wake in state.waiters.values():
                        wake.set()
                await asyncio.sleep(0.1)
                continue
            if message is None:
                if not self._channels:
                    self._reader = None
                    return
                continue
            name = _text(message["channel"])
            channel = self._channels.get(name)
            if channel is None:
                continue
            if message["type"] == "subscribe":
                channel.subscribed.set()
                await self._drop_if_idle(name, channel)
            elif message["type"] == "message":
                waiter, fence = parse_wake(_text(message["data"]))
                woken = channel.waiters.get(waiter)
                if woken is not None:
                    woken.set(fence)

    async def aclose(self) -> None:
        # Tasks still waiting are woken, and leave without touching the connection.
        for state in self._channels.values():
            for wake in state.waiters.values():
                wake.set()
        self._channels.clear()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None
        if self._pubsub is not None:
            with contextlib.suppress(*UNAVAILABLE):
                await self._pubsub.aclose()
            self._pubsub = None


@dataclass(slots=True)
class _Held:
    """A lease one of our tasks or threads holds (or was handed), as far as the backend knows."""

    token: str
    deadline: float  # loop time (async) or the backend's clock, never later than the lease's end
    loop: asyncio.AbstractEventLoop | None = None  # the holder's (async only)
    riders: list[str] = field(default_factory=list)  # waiter ids its release will queue


def _unride(waker: _Waker | SyncWaker, resource: str, riders: Sequence[str]) -> None:
    """Tell ``riders`` that no release queued them: each tries for itself."""
    channel = lock_keys(resource).channel
    for rider in riders:
        waker.hand(channel, rider, None)


#: A task rides on a holder's release only if that lease has this long left (s).
_RIDE_MARGIN = 0.05


class RedisLockBackend(QueuedBackend):
    """Locks on one Redis server or a Redis Cluster (``redis.asyncio`` client).

    ``timeout`` bounds every round trip: a Redis that is down or stalled raises
    ``BackendUnavailable`` within it. With ``coalesce`` (the default), the lock
    scripts go over one pipelined connection per event loop that headway drives
    itself (see ``_wire``): a lone call is written at once, calls made
    concurrently share writes. ``coalesce=False``, or a Cluster client, sends
    every call through redis-py.

    On that connection, a task that asks for a lock one of our own tasks holds
    sends nothing: it *rides* on the holder's release, which queues it in Redis
    (behind those already waiting) in the same script that hands the lock on.
    Under contention within one process that is one script per grant instead of
    two. A holder that stops without releasing costs a rider no more than the
    bounded waits every waiter has: once the lease is known to be over, riders
    try for themselves.
    """

    name = "redis"

    def __init__(
        self,
        client: Any,
        *,
        timeout: float = 2.0,
        coalesce: bool = True,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(clock)
        self.client = client
        self.timeout = timeout
        self._wires = Wires(client, coalesce)
        self._waker = _Waker(client, timeout)
        self.node = secrets.token_hex(4)
        self._held: dict[str, _Held] = {}

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float = 2.0, coalesce: bool = True, **options: Any
    ) -> RedisLockBackend:
        """Connect to ``url`` (``redis://``, ``rediss://``, ``unix://``)."""
        options.setdefault("socket_connect_timeout", timeout)
        options.setdefault("socket_timeout", timeout)
        return cls(aioredis.Redis.from_url(url, **options), timeout=timeout, coalesce=coalesce)

    async def _call(
        self,
        script: Script,
        keys: Sequence[str],
        args: list[Any],
        orphan: Callable[[Any], object] | None = None,
        always: bool = False,
    ) -> Any:
        try:
            return await self._wires.call(script, keys, args, orphan, self.timeout, always)
        except UNAVAILABLE as exc:
            raise unavailable(exc, self.timeout) from exc

    def _shielded(self) -> bool:
        return self._wires.ready() is not None

    def _ride(self, resource: str, step: Try) -> Attempt | None:
        """Queue ``step``'s waiter on our holder's release, if one of our tasks holds the lock.

        Returns the refusal the acquire script would have given, or None to run it.
        """
        held = self._held.get(resource)
        if held is None or held.token == step.token or not step.waiter:
            return None
        loop = asyncio.get_running_loop()
        left = held.deadline - loop.time()
        if left < _RIDE_MARGIN:  # over, as far as we know: its riders try for themselves
            riders = self._forget(resource, held.token)
            self._unride(resource, [r for r in riders if r != step.waiter])
            return None
        # Only on our own connection, where the release is written before any later
        # leave of the rider's (FIFO).
        if held.loop is not loop or self._wires.ready() is None:
            if step.waiter in held.riders:
                held.riders.remove(step.waiter)  # it queues itself now: the release must not
            return None
        if step.waiter not in held.riders:
            held.riders.append(step.waiter)
        return Attempt(False, pttl_ms=int(left * 1000))

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """Acquire ``resource`` (see ``LockBackend.acquire``)."""
        if resource in self._held and timeout:
            return await self._ride_acquire(resource, ttl, timeout)
        return await self._acquire(resource, ttl, timeout)

    async def _ride_acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        """Wait for a lock one of our tasks holds without the general flow's machinery.

        The first step of a contended acquire, cut short: ride on the holder's release
        (``_ride``) and wait for the hand-over. Whenever that does not apply, or the wait
        ends without the lock, the general flow goes on with the same waiter.
        """
        began = self.clock()
        ttl_ms = check_ttl(ttl)
        timeout = check_timeout(timeout)
        token = new_token()
        waiter = waiter_id(token, ttl_ms, self.node)
        channel = lock_keys(resource).channel
        # Only while other waiters keep the channel subscribed: a release by another
        # client that hands us the lock tells us there.
        wake = self._waker.join(channel, waiter)
        if wake is None:
            return await self._acquire(resource, ttl, timeout, token, began)
        fence = None
        try:
            if (ridden := self._ride(resource, Try(token, ttl_ms, waiter, PLACE_MS))) is not None:
                hint = ridden.pttl_ms / 1000 * random.uniform(1.0, 1.1)
                fence = await wake.wait(min(timeout, hint, WAIT_CAP))
        except BaseException:
            # Queued by a release perhaps (or handed the lock as we left): leave as
            # every waiter does, which hands the lock on if it was ours.
            await self._waker.part(channel, waiter)
            with contextlib.suppress(Exception):
                await complete(self._leave(resource, waiter))
            raise
        await self._waker.part(channel, waiter)
        if fence is not None:
            # Handed over after our ride began, so the lease counts from then.
            return Lease(resource, token, fence, began + ttl_ms / 1000, ttl_ms / 1000)
        return await self._acquire(resource, ttl, timeout, token, began)

    def _holds(self, resource: str, token: str, ttl_ms: int, since: float) -> None:
        """Record (or renew) ``token``'s hold on ``resource``, keeping its riders."""
        held = self._held.get(resource)
        if held is not None and held.token == token:
            held.deadline = since + ttl_ms / 1000
        else:
            if held is not None:  # that hold is over (the lock is ``token``'s now)
                self._unride(resource, held.riders)
            loop = asyncio.get_running_loop()
            self._held[resource] = _Held(token, since + ttl_ms / 1000, loop)

    def _forget(self, resource: str, token: str) -> list[str]:
        """Forget ``token``'s hold on ``resource``; returns the riders its release takes."""
        held = self._held.get(resource)
        if held is None or held.token != token:
            return []
        del self._held[resource]
        return held.riders

    def _unride(self, resource: str, riders: Sequence[str]) -> None:
        _unride(self._waker, resource, riders)

    async def _try(self, resource: str, step: Try) -> Attempt:
        if (ridden := self._ride(resource, step)) is not None:
            return ridden

        def orphan(reply: Any) -> None:  # what the driver's ``undo`` does, without a task
            wire = self._wires.ready()
            if wire is None:
                return  # the connection is gone: the grant or the place expires
            if Attempt.from_reply(reply).granted:
                forget(wire.submit(RELEASE, *release_call(resource, step.token)))
            elif step.waiter:
                forget(wire.submit(LEAVE, *leave_call(resource, step.waiter)))

        keys, args = acquire_call(resource, step)
        sent = asyncio.get_running_loop().time()
        attempt = Attempt.from_reply(await self._call(ACQUIRE, keys, args, orphan))
        if attempt.granted:
            self._holds(resource, step.token, step.ttl_ms, sent)
        return attempt

    async def _release(self, resource: str, token: str) -> bool:
        channel = lock_keys(resource).channel
        riders = self._forget(resource, token)
        sent = asyncio.get_running_loop().time()  # the handed lease starts after this

        def handed(reply: Any) -> None:
            # Handed to the next waiter, which we tell if it is ours (a waiter of another
            # client hears it on the channel). Done as the reply arrives, even if our
            # caller stopped waiting, so our waiter is not left to its bounded wait.
            if (to := handed_to(reply)) is not None:
                waiter, fence = to
                next_token, ttl_ms, node = parse_waiter(waiter)
                if node == self.node:
                    self._holds(resource, next_token, ttl_ms, sent)
                self._waker.hand(channel, waiter, fence)
            elif not reply:  # the lease had ended: the release queued nobody
                self._unride(resource, riders)

        retried = not self._wires.direct()
        keys, args = release_call(resource, token, self.node, retried, riders)
        try:
            reply = await self._call(RELEASE, keys, args, handed, always=True)
        except BaseException:
            self._unride(resource, riders)  # queued or not: trying again is safe
            raise
        return bool(reply)

    async def _extend(self, resource: str, token: str, ttl_ms: int) -> bool:
        keys = lock_keys(resource).extend
        sent = asyncio.get_running_loop().time()
        extended = bool(await self._call(EXTEND, keys, [token, ttl_ms]))
        held = self._held.get(resource)
        if held is not None and held.token == token:
            if extended:
                held.deadline = sent + ttl_ms / 1000
            else:
                self._unride(resource, self._forget(resource, token))
        return extended

    async def _leave(self, resource: str, waiter: str) -> None:
        held = self._held.get(resource)
        if held is not None:
            if waiter in held.riders:
                held.riders.remove(waiter)  # an earlier release may have queued it: leave anyway
            elif waiter.startswith(held.token + ":"):
                # Handed the lock as it left: the script releases it and hands it on in
                # Redis, without our riders, who try for themselves.
                self._unride(resource, self._forget(resource, held.token))
        await self._call(LEAVE, *leave_call(resource, waiter))

    def _listen(self, resource: str, waiter: str) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._waker.listen(lock_keys(resource).channel, waiter)

    def _listening(self, resource: str) -> bool:
        return self._waker.ready(lock_keys(resource).channel)

    async def aclose(self) -> None:
        """Stop the wake-up listener and return headway's connection to the client's pool.

        The client itself stays the caller's.
        """
        await self._waker.aclose()
        await self._wires.aclose()


@dataclass(slots=True)
class _Taken:
    """The riders a release in flight queues, and those of them that gave up meanwhile."""

    riders: list[str]
    gone: list[str] = field(default_factory=list)


class SyncRedisLockBackend(SyncQueuedBackend):
    """The synchronous Redis backend (``redis.Redis`` or ``redis.cluster.RedisCluster``).

    With ``direct`` (the default) the scripts go over sockets headway drives
    itself (``_wire.SyncWire``), one per thread in a call; ``direct=False``, or
    a Cluster client, sends every call through redis-py. The client's socket
    timeout bounds every round trip.

    On those sockets a thread that asks for a lock one of our own threads holds
    rides on the holder's release, as in ``RedisLockBackend``. Threads share no
    socket, so a rider that gives up while the release that queues it is in
    flight leaves through the releasing thread, after that release: never ahead
    of it.
    """

    name = "redis"

    def __init__(
        self,
        client: Any,
        *,
        timeout: float = 2.0,
        direct: bool = True,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(clock)
        self.client = client
        self.timeout = timeout
        self._wire = SyncWire(client, direct)
        self._waker = SyncWaker(client, timeout, UNAVAILABLE)
        self.node = secrets.token_hex(4)
        # Guards _held and _taken; never held while calling Redis or the waker.
        self._mutex = threading.Lock()
        self._held: dict[str, _Held] = {}
        self._taken: dict[str, list[_Taken]] = {}

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float = 2.0, direct: bool = True, **options: Any
    ) -> SyncRedisLockBackend:
        """Connect to ``url`` (``redis://``, ``rediss://``, ``unix://``)."""
        options.setdefault("socket_connect_timeout", timeout)
        options.setdefault("socket_timeout", timeout)
        return cls(redis.Redis.from_url(url, **options), timeout=timeout, direct=direct)

    def _call(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except UNAVAILABLE as exc:
            raise unavailable(exc, self.timeout) from exc

    def _unride(self, resource: str, riders: Sequence[str]) -> None:
        _unride(self._waker, resource, riders)

    def _ride(self, resource: str, step: Try) -> Attempt | None:
        """Queue ``step``'s waiter on our holder's release (see ``RedisLockBackend._ride``)."""
        if not step.waiter or not self._wire.enabled:
            return None
        over: list[str] = []
        with self._mutex:
            held = self._held.get(resource)
            if held is None or held.token == step.token:
                return None
            left = held.deadline - self.clock()
            if left >= _RIDE_MARGIN:
                if step.waiter not in held.riders:
                    held.riders.append(step.waiter)
                return Attempt(False, pttl_ms=int(left * 1000))
            # Over, as far as we know: its riders try for themselves.
            del self._held[resource]
            over = [r for r in held.riders if r != step.waiter]
        self._unride(resource, over)
        return None

    def _holds(self, resource: str, token: str, ttl_ms: int, since: float) -> list[str]:
        """Record ``token``'s hold (mutex held); returns riders of a hold it replaces."""
        held = self._held.get(resource)
        if held is not None and held.token == token:
            held.deadline = since + ttl_ms / 1000
            return []
        self._held[resource] = _Held(token, since + ttl_ms / 1000)
        return held.riders if held is not None else []

    def _try(self, resource: str, step: Try) -> Attempt:
        if (ridden := self._ride(resource, step)) is not None:
            return ridden
        keys, args = acquire_call(resource, step)
        sent = self.clock()
        attempt = Attempt.from_reply(self._call(lambda: self._wire.call(ACQUIRE, keys, args)))
        if attempt.granted and self._wire.enabled:
            with self._mutex:
                replaced = self._holds(resource, step.token, step.ttl_ms, sent)
            self._unride(resource, replaced)
        return attempt

    def _release(self, resource: str, token: str) -> bool:
        taken: _Taken | None = None
        with self._mutex:
            held = self._held.get(resource)
            if held is not None and held.token == token:
                del self._held[resource]
                if held.riders:
                    taken = _Taken(held.riders)
                    self._taken.setdefault(resource, []).append(taken)
        riders = taken.riders if taken is not None else []
        sent = self.clock()  # the handed lease starts after this
        keys, args = release_call(resource, token, self.node, not self._wire.enabled, riders)
        reply: Any = None
        try:
            reply = self._call(lambda: self._wire.call(RELEASE, keys, args))
        finally:
            self._released(resource, taken, reply, sent)
        return bool(reply)

    def _released(self, resource: str, taken: _Taken | None, reply: Any, sent: float) -> None:
        """After a release (``reply`` None if it failed): tell the waiters what became of them."""
        to = handed_to(reply)
        unride: list[str] = []
        with self._mutex:
            gone = taken.gone if taken is not None else []
            if taken is not None:
                self._taken[resource].remove(taken)
                if not self._taken[resource]:
                    del self._taken[resource]
                if not reply:  # failed, or the lease had ended: it queued nobody
                    unride = [r for r in taken.riders if r not in gone]
            if to is not None and to[0] not in gone:
                next_token, ttl_ms, node = parse_waiter(to[0])
                if node == self.node and self._wire.enabled:
                    unride += self._holds(resource, next_token, ttl_ms, sent)
        channel = lock_keys(resource).channel
        if to is not None and to[0] not in gone:  # if the waiter is one of ours, tell it
            self._waker.hand(channel, *to)
        self._unride(resource, unride)
        for waiter in gone:  # after the release that queued them: never ahead of it
            with contextlib.suppress(BackendUnavailable):
                self._send_leave(resource, waiter)

    def _leave(self, resource: str, waiter: str) -> None:
        unride: list[str] = []
        with self._mutex:
            for taken in self._taken.get(resource, ()):
                if waiter in taken.riders:
                    # A release in flight queues it: its thread sends our leave after it.
                    taken.gone.append(waiter)
                    return
            held = self._held.get(resource)
            if held is not None:
                if waiter in held.riders:
                    held.riders.remove(waiter)  # an earlier release may have queued it
                elif waiter.startswith(held.token + ":"):
                    # Handed the lock as it left: the script releases it and hands it on
                    # in Redis, without our riders, who try for themselves.
                    del self._held[resource]
                    unride = held.riders
        self._unride(resource, unride)
        self._send_leave(resource, waiter)

    def _send_leave(self, resource: str, waiter: str) -> None:
        keys, args = leave_call(resource, waiter)
        self._call(lambda: self._wire.call(LEAVE, keys, args))

    def _extend(self, resource: str, token: str, ttl_ms: int) -> bool:
        keys = lock_keys(resource).extend
        sent = self.clock()
        extended = bool(self._call(lambda: self._wire.call(EXTEND, keys, [token, ttl_ms])))
        unride: list[str] = []
        with self._mutex:
            held = self._held.get(resource)
            if held is not None and held.token == token:
                if extended:
                    held.deadline = sent + ttl_ms / 1000
                else:
                    del self._held[resource]
                    unride = held.riders
        self._unride(resource, unride)
        return extended

    def _listen(self, resource: str, waiter: str) -> contextlib.AbstractContextManager[Any]:
        return self._waker.listen(lock_keys(resource).channel, waiter)

    def _listening(self, resource: str) -> bool:
        return self._waker.ready(lock_keys(resource).channel)

    def close(self) -> None:
        """Stop the wake-up listener and close headway's connections.

        The client itself stays the caller's.
        """
        self._waker.close()
        self._wire.close()
