"""The keys one backend (and its mode views) has put: each one's session, its lapse, the
watch of a waiter, and the keys left to sweep.

A key is tracked from an acquire's first attempt until it is released, left, lapsed or
lost with its session. A key we stop tracking must not stay behind: its session is kept
alive, and with it every key under it, so a delete that failed is retried in the
background (``sweep``) until it is done or the session ended.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from headway._clock import Clock
from headway._errors import BackendUnavailable
from headway.lock.backends.etcd.codec import EtcdError, b64
from headway.lock.backends.etcd.session import Session
from headway.lock.backends.etcd.transport import Transport

__all__ = ["Place", "Places", "Watch"]

#: How often a key we could not delete is tried again (s).
_SWEEP = 0.25


@dataclass(slots=True)
class Place:
    """One acquire's key, from its first attempt until it is released, left or lost."""

    key: str
    session: Session
    revision: int = 0  # its create revision, once known
    lapse: asyncio.TimerHandle | None = None  # while held: deletes the key at its lapse


class Watch:
    """A waiter's watch on what keeps it out (``Transport.deleted`` with no time bound),
    open until that goes."""

    def __init__(self, watching: Coroutine[Any, Any, None], opened: float) -> None:
        self.opened = opened
        self.gone = asyncio.Event()
        self.task = asyncio.create_task(self._run(watching))

    async def _run(self, watching: Coroutine[Any, Any, None]) -> None:
        try:
            await watching
        finally:  # deleted, or the stream broke: either way, look again
            self.gone.set()


class Places:
    """The keys of one backend, by lease token."""

    def __init__(self, transport: Transport, clock: Clock) -> None:
        self.transport, self.clock = transport, clock
        self.places: dict[str, Place] = {}
        #: token -> the watch on what keeps it out, while it waits.
        self.watches: dict[str, Watch] = {}
        #: lapses and sweeps under way.
        self.tasks: set[asyncio.Task[Any]] = set()

    def new(self, token: str, key: str, session: Session) -> Place:
        """Track ``token``'s key (not put yet) under ``session``."""
        place = self.places[token] = Place(key, session)
        return place

    def hold(self, token: str, place: Place, sent: float) -> None:
        """``token`` holds its key, granted or renewed by a call sent at ``sent`` (our
        clock), until its lapse: as a lease of the session's TTL would (the acquire's
        ``ttl`` in whole seconds, at least etcd's minimum), unless extended."""
        self.unwatch(token)
        if place.lapse is not None:
            place.lapse.cancel()
        delay = max(0.0, sent + place.session.granted - self.clock())
        place.lapse = asyncio.get_running_loop().call_later(delay, self._lapse, token)

    def watch(self, token: str, watching: Coroutine[Any, Any, None]) -> None:
        """``token`` waits until ``watching`` returns."""
        self.unwatch(token)
        self.watches[token] = Watch(watching, self.clock())

    def unwatch(self, token: str) -> None:
        watch = self.watches.pop(token, None)
        if watch is not None:
            watch.task.cancel()

    def forget(self, token: str) -> Place | None:
        """Stop tracking ``token``'s key (not deleting it); its place, if it had one."""
        self.unwatch(token)
        place = self.places.pop(token, None)
        if place is not None:
            place.session.tokens.discard(token)
            if place.lapse is not None:
                place.lapse.cancel()
        return place

    async def drop(self, token: str) -> bool:
        """Delete ``token``'s key: True if it was there (a live session's)."""
        place = self.forget(token)
        if place is None:
            return False
        try:
            reply = await self.transport.call("kv/deleterange", {"key": b64(place.key)})
        except BaseException:
            self._spawn(self._sweep(place))
            raise
        return int(reply.get("deleted", 0)) > 0 and not place.session.lost

    def abandon(self, token: str) -> None:
        """Stop tracking ``token``'s key and delete it in the background."""
        place = self.forget(token)
        if place is not None:
            self._spawn(self._sweep(place, 0.0))

    def lost(self, session: Session) -> None:
        """``session`` ended: its keys are gone, its waiters must look again."""
        for token in list(session.tokens):
            watch = self.watches.get(token)
            self.forget(token)
            if watch is not None:
                watch.gone.set()

    def _lapse(self, token: str) -> None:
        self._spawn(self.drop(token))

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self._spawned)

    def _spawned(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled():
            task.exception()  # a lapse that failed is swept: nothing to report

    async def _sweep(self, place: Place, pause: float = _SWEEP) -> None:
        """Delete a key we no longer track, until it is done or its session ended."""
        while not place.session.lost:
            await asyncio.sleep(pause)
            with contextlib.suppress(BackendUnavailable, EtcdError):
                await self.transport.call("kv/deleterange", {"key": b64(place.key)})
                return
            pause = _SWEEP

    def close(self) -> tuple[set[Session], list[str]]:
        """Stop tracking every key; the sessions still holding a lock, and the keys of
        waits under them (which no one will end now)."""
        held = {p.session for p in self.places.values() if p.lapse is not None}
        waiting = [p.key for p in self.places.values() if p.lapse is None and p.session in held]
        for token in list(self.places):
            self.forget(token)
        for task in list(self.tasks):
            task.cancel()
        return held, waiting
