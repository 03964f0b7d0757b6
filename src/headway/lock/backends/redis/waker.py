"""Wake-ups for the async Redis backend: one pub/sub connection per backend.

The tasks waiting on locks of one ``RedisLockBackend`` share one subscription
per lock channel; a reader task routes each message to the waiter it names.
A subscription whose last listener leaves is dropped. On a Redis Cluster each
primary has a ``Waker`` of its own, on sharded channels (see ``cluster_waker``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from headway._clock import within
from headway._redis.errors import UNAVAILABLE
from headway.lock.backends.redis.keys import text
from headway.lock.driver import run_to_end
from headway.lock.flow import Wake, parse_wake

__all__ = ["Waker"]

log = logging.getLogger("headway.lock")


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
class _TaskChannel:
    subscribed: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: dict[str, Wake[asyncio.Event]] = field(default_factory=dict)


#: The commands and message types of classic and of sharded (Redis 7) pub/sub.
CLASSIC = ("subscribe", "unsubscribe", "message")
SHARDED = ("ssubscribe", "sunsubscribe", "smessage")
# Not answering, or a MOVED reply to a (un)subscription: the slot moved, its waiters retry.
_MISSED: tuple[type[BaseException], ...] = (*UNAVAILABLE, ResponseError)


class Waker:
    """One pub/sub connection that routes wake-ups to the tasks waiting for them.

    ``sharded``: the channels are sharded ones, all owned by the one node ``client``
    talks to (a Cluster primary).
    """

    def __init__(self, client: Any, timeout: float, *, sharded: bool = False) -> None:
        self._client = client
        self._timeout = timeout
        self._subscribe_command, self._unsubscribe_command, self._message = (
            SHARDED if sharded else CLASSIC
        )
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._channels: dict[str, _TaskChannel] = {}
        # redis-py's pub/sub (the Cluster one above all) is not safe for concurrent
        # commands while it connects: one SUBSCRIBE or UNSUBSCRIBE at a time.
        self._commands = asyncio.Lock()

    async def listen(self, channel: str, waiter: str) -> _EventWaiter:
        """Route wake-ups addressed to ``waiter`` on ``channel`` to the waiter returned,
        subscribing first if nobody listens there yet; ``part`` ends it."""
        state = self._channels.get(channel)
        fresh = state is None
        if state is None:
            state = self._channels[channel] = _TaskChannel()
        wake = state.waiters[waiter] = Wake(asyncio.Event())
        try:
            if fresh:
                await self._subscribe(channel, state)
            # A wait is bounded anyway, so a slow confirmation only costs latency.
            if not state.subscribed.is_set() and self._channels.get(channel) is state:
                with contextlib.suppress(TimeoutError):
                    await within(self._timeout, state.subscribed.wait())
        except BaseException:
            await self.part(channel, waiter)
            raise
        return _EventWaiter(wake)

    def join(self, channel: str, waiter: str) -> _EventWaiter | None:
        """Listen as ``listen`` does if that costs no I/O (``channel`` is subscribed),
        else None."""
        state = self._channels.get(channel)
        if state is None or not state.subscribed.is_set():
            return None
        wake = state.waiters[waiter] = Wake(asyncio.Event())
        return _EventWaiter(wake)

    async def part(self, channel: str, waiter: str) -> None:
        """Stop listening for ``waiter`` (after ``listen`` or ``join``)."""
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

    async def _drop_if_idle(self, channel: str, state: _TaskChannel) -> None:
        # An unconfirmed subscription is kept until the reader sees its confirmation,
        # so a later subscription to the channel can never be confirmed by this one's.
        if (
            state.waiters
            or not state.subscribed.is_set()
            or self._channels.get(channel) is not state
        ):
            return
        del self._channels[channel]
        # In a task of its own, finished even if our caller is cancelled: redis-py's
        # unsubscribe can swallow a cancellation (the driver notices, see ``_cancels``),
        # and one cut short would leave the connection subscribed to a dropped channel.
        await run_to_end(self._unsubscribe(channel))

    async def _unsubscribe(self, channel: str) -> None:
        with contextlib.suppress(*UNAVAILABLE):
            async with self._commands:
                await getattr(self._pubsub, self._unsubscribe_command)(channel)

    async def _subscribe(self, channel: str, state: _TaskChannel) -> None:
        sent = False
        task = asyncio.current_task()
        cancels = task.cancelling() if task is not None else 0
        try:
            if self._pubsub is None:
                self._pubsub = self._client.pubsub()
            async with asyncio.timeout(self._timeout), self._commands:
                await getattr(self._pubsub, self._subscribe_command)(channel)
            sent = True
        except _MISSED:
            # Waits are bounded, and the next attempt reports the outage (a MOVED
            # reply: the slot moved, and the next listener goes to its new owner).
            pass
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
        if task is not None and task.cancelling() > cancels:
            # redis-py's subscribe can swallow a cancellation (one that comes while it
            # connects) and return: the subscription is made, the cancellation goes on.
            raise asyncio.CancelledError

    async def _read(self) -> None:
        while True:
            try:
                message = await self._pubsub.get_message(timeout=1.0)
            except _MISSED:
                # Wake everybody: each retries (and sees the outage, or finds the slot's
                # new owner) instead of idling. A node gone for good: its reader ends.
                for state in self._channels.values():
                    for wake in state.waiters.values():
                        wake.set()
                if not self._channels:
                    self._reader = None
                    return
                await asyncio.sleep(0.1)
                continue
            if message is None:
                if not self._channels:
                    self._reader = None
                    return
                continue
            name = text(message["channel"])
            channel = self._channels.get(name)
            if channel is None:
                continue
            kind = message["type"]
            if kind == self._subscribe_command:
                channel.subscribed.set()
                await self._drop_if_idle(name, channel)
            elif kind == self._unsubscribe_command and channel.subscribed.is_set():
                await self._unsubscribed(name, channel)
            elif kind == self._message:
                waiter, fence = parse_wake(text(message["data"]))
                woken = channel.waiters.get(waiter)
                if woken is not None:
                    woken.set(fence)

    async def _unsubscribed(self, name: str, state: _TaskChannel) -> None:
        # The server ended a live subscription (ours are deleted from the table before
        # we unsubscribe): its slot moved to another Cluster node. Its waiters try again
        # now, and whoever listens next subscribes on the new owner.
        del self._channels[name]
        for wake in state.waiters.values():
            wake.set()
        # Tell redis-py too, which would otherwise subscribe it again on a reconnect.
        with contextlib.suppress(*_MISSED):
            async with self._commands:
                await getattr(self._pubsub, self._unsubscribe_command)(name)

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
