"""Wake-ups for the sync Redis backend: one pub/sub connection, one reader thread.

The threads waiting on locks of one ``SyncRedisLockBackend`` share one
subscription per lock channel, as the async backend's tasks do: a daemon
thread reads the connection and sets the event of the waiter each message
names. (A connection per waiting call cost a TCP connect, a handshake and a
SUBSCRIBE on every contended acquire.) The thread ends once nobody listens.
On a Redis Cluster each primary has a ``SyncWaker`` of its own, on sharded
channels (see ``cluster_waker``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from headway.lock.backends.redis.keys import text
from headway.lock.backends.redis.waker import CLASSIC, SHARDED
from headway.lock.flow import Wake, parse_wake

__all__ = ["SyncWaker"]

log = logging.getLogger("headway.lock")


class _ThreadWaiter:
    def __init__(self, wake: Wake[threading.Event]) -> None:
        self.wake = wake

    def wait(self, seconds: float) -> int | None:
        # A wake-up that lands between the wait and the clear is covered by the
        # attempt the waiter makes next (which finds a lock handed over meanwhile).
        self.wake.event.wait(seconds)
        self.wake.event.clear()
        return self.wake.fence


@dataclass
class _ThreadChannel:
    subscribed: threading.Event = field(default_factory=threading.Event)
    waiters: dict[str, Wake[threading.Event]] = field(default_factory=dict)


class SyncWaker:
    """One pub/sub connection, read by a daemon thread, that wakes the waiting threads.

    ``unavailable`` lists the errors that mean Redis is not answering; ``sharded``
    as in ``Waker``.
    """

    def __init__(
        self,
        client: Any,
        timeout: float,
        unavailable: tuple[type[BaseException], ...],
        *,
        sharded: bool = False,
    ) -> None:
        self._client = client
        self._timeout = timeout
        # A MOVED reply to a (un)subscription: the slot moved; its waiters retry.
        self._unavailable: tuple[type[BaseException], ...] = (*unavailable, ResponseError)
        self._subscribe_command, self._unsubscribe_command, self._message = (
            SHARDED if sharded else CLASSIC
        )
        # Guards the channel table, and orders SUBSCRIBE / UNSUBSCRIBE as the table changes.
        self._lock = threading.Lock()
        self._pubsub: Any = None
        self._reader: threading.Thread | None = None
        self._channels: dict[str, _ThreadChannel] = {}

    def listen(self, channel: str, waiter: str) -> _ThreadWaiter:
        """Route wake-ups addressed to ``waiter`` on ``channel`` to the waiter returned,
        subscribing first if nobody listens there yet; ``part`` ends it."""
        wake = Wake(threading.Event())
        with self._lock:
            state = self._channels.get(channel)
            shared = state is not None
            if state is None:
                state = _ThreadChannel()
                # If Redis does not answer, wait alone: waits are bounded, and the
                # next attempt reports the outage.
                if self._send(self._subscribe_command, channel):
                    self._channels[channel] = state
                    shared = True
                    if self._reader is None:
                        self._start_reader()
            state.waiters[waiter] = wake
        if shared:
            try:
                state.subscribed.wait(self._timeout)
            except BaseException:
                self.part(channel, waiter)
                raise
        return _ThreadWaiter(wake)

    def join(self, channel: str, waiter: str) -> _ThreadWaiter | None:
        """Listen as ``listen`` does if that costs no I/O (``channel`` is subscribed),
        else None."""
        with self._lock:
            state = self._channels.get(channel)
            if state is None or not state.subscribed.is_set():
                return None
            wake = state.waiters[waiter] = Wake(threading.Event())
        return _ThreadWaiter(wake)

    def part(self, channel: str, waiter: str) -> None:
        """Stop listening for ``waiter`` (after ``listen`` or ``join``)."""
        with self._lock:
            state = self._channels.get(channel)
            if state is not None and state.waiters.pop(waiter, None) is not None:
                self._drop_if_idle(channel, state)

    def hand(self, channel: str, waiter: str, fence: int | None) -> None:
        """Tell a waiter of ours that it was handed the lock (no message comes for it),
        or, with no fence, that it should try again."""
        with self._lock:
            state = self._channels.get(channel)
            wake = state.waiters.get(waiter) if state is not None else None
        if wake is not None:
            wake.set(fence)

    def _send(self, command: str, channel: str) -> bool:
        if self._pubsub is None:
            self._pubsub = self._client.pubsub()
        try:
            getattr(self._pubsub, command)(channel)
        except self._unavailable:
            return False
        return True

    def _drop_if_idle(self, channel: str, state: _ThreadChannel) -> None:
        # An unconfirmed subscription is kept until the reader sees its confirmation,
        # so a later subscription to the channel can never be confirmed by this one's.
        if (
            state.waiters
            or not state.subscribed.is_set()
            or self._channels.get(channel) is not state
        ):
            return
        del self._channels[channel]
        self._send(self._unsubscribe_command, channel)

    def _start_reader(self) -> None:  # with the lock held
        self._reader = threading.Thread(
            target=self._read, args=(self._pubsub,), name="headway-lock-wakeups", daemon=True
        )
        self._reader.start()

    def _read(self, pubsub: Any) -> None:
        try:
            while self._next(pubsub):
                pass
        except Exception:
            # Not an outage (those are retried above): a bug, or the client closed under
            # us. Log it; the next listener starts a fresh reader, and waits are bounded.
            log.exception("the lock wake-up reader stopped")
            with self._lock:
                if self._reader is threading.current_thread():
                    self._reader = None

    def _next(self, pubsub: Any) -> bool:
        """Route one message; False once this reader should end."""
        with self._lock:
            closed = self._pubsub is not pubsub
            idle = not self._channels
            if closed or idle:
                self._reader = None
                if closed and not idle:  # reused after close(): read the new connection
                    self._start_reader()
        if closed:  # close() left the connection to its reader
            with contextlib.suppress(*self._unavailable):
                pubsub.close()
        if closed or idle:
            return False
        try:
            message = pubsub.get_message(timeout=1.0)
        except self._unavailable:
            # Wake everybody: each retries (and sees the outage) instead of idling.
            with self._lock:
                wakes = [w for s in self._channels.values() for w in s.waiters.values()]
            for wake in wakes:
                wake.set()
            if not wakes:
                return True  # ends at the next turn if nobody listens: a node gone for good
            time.sleep(0.1)
            return True
        if message is not None:
            self._route(message)
        return True

    def _route(self, message: dict[str, Any]) -> None:
        name = text(message["channel"])
        with self._lock:
            state = self._channels.get(name)
            if state is None:
                return
            kind = message["type"]
            if kind == self._subscribe_command:
                state.subscribed.set()
                self._drop_if_idle(name, state)
            elif kind == self._unsubscribe_command and state.subscribed.is_set():
                # The server ended a live subscription (ours leave the table first):
                # its slot moved to another Cluster node. Its waiters try again now,
                # and whoever listens next subscribes on the new owner; redis-py is
                # told, or it would subscribe the channel again on a reconnect.
                del self._channels[name]
                for wake in state.waiters.values():
                    wake.set()
                self._send(self._unsubscribe_command, name)
            elif kind == self._message:
                waiter, fence = parse_wake(text(message["data"]))
                woken = state.waiters.get(waiter)
                if woken is not None:
                    woken.set(fence)

    def close(self) -> None:
        """Stop listening and close the connection; threads still waiting are woken."""
        with self._lock:
            pubsub, self._pubsub = self._pubsub, None
            for state in self._channels.values():
                for wake in state.waiters.values():
                    wake.set()
            self._channels.clear()
            reader = self._reader
            if pubsub is not None and reader is not None:
                # The replies wake the reader now rather than at its next 1 s timeout.
                with contextlib.suppress(*self._unavailable):
                    pubsub.unsubscribe()
        if reader is not None:
            reader.join(self._timeout)  # it closes the connection, its own
        elif pubsub is not None:
            with contextlib.suppress(*self._unavailable):
                pubsub.close()
