"""Who of ours holds each Redis lock, and who rides on each holder's release.

A task (or thread) that asks for a lock another task of the same backend holds
sends nothing: it *rides* on the holder's release, which queues it in Redis
(behind those already waiting) in the same script that hands the lock on. One
script per grant instead of two. A holder that stops without releasing costs
its riders no more than the bounded waits every waiter has: once its lease is
known to be over, riders try for themselves.

``Riders`` is that record, one per backend, shared by the async and the sync
shell. It never calls Redis; it tells waiters what became of them through the
backend's waker.

Riding needs the rider's later ``leave`` to reach Redis after the release that
queued it. On one pipelined connection (``ordered``) that is FIFO. Threads
share no socket, so there a rider that gives up while the release that queues
it is in flight only marks itself gone, and the releasing thread sends its
leave after the release's reply.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from headway.lock.backends.redis.keys import handed_to, lock_keys
from headway.lock.flow import Attempt, Try, parse_waiter

__all__ = ["RIDE_MARGIN", "LocalHolder", "Release", "Riders"]

#: A task rides on a holder's release only if that lease has this long left (s).
RIDE_MARGIN = 0.05


class _Hands(Protocol):
    def hand(self, channel: str, waiter: str, fence: int | None) -> None: ...


@dataclass(slots=True)
class LocalHolder:
    """A lease one of our tasks or threads holds (or was handed), as far as we know."""

    token: str
    deadline: float  # on the shell's clock, never later than the lease's end
    home: object  # where riders may ride (the holder's event loop; the sync backend)
    riders: list[str] = field(default_factory=list)  # waiter ids its release will queue


@dataclass(slots=True)
class Release:
    """A release in flight: the riders it queues, and those of them that gave up meanwhile."""

    riders: Sequence[str]
    gone: list[str] = field(default_factory=list)


_NOBODY = Release(())  # a release that queues nobody (never registered, never changed)


class Riders:
    """The holds of one backend's tasks or threads, and their riders (thread-safe).

    Times (``now``, ``since``) are on the shell's clock; ``home`` says where a
    caller runs (None: riding is not possible there now).
    """

    def __init__(self, waker: _Hands, *, ordered: bool, sharded: bool = False) -> None:
        self._waker = waker
        self._ordered = ordered
        self._sharded = sharded  # the waiters' channel (see ``keys.lock_keys``)
        self._mutex = threading.Lock()  # never held while telling a waiter
        self.held: dict[str, LocalHolder] = {}
        self._releasing: dict[str, list[Release]] = {}

    def ride(self, resource: str, step: Try, now: float, home: object) -> Attempt | None:
        """Queue ``step``'s waiter on our holder's release if one of ours holds the lock
        in ``home``; returns the refusal the acquire script would give, or None to run it."""
        if not step.waiter:
            return None
        with self._mutex:
            held = self.held.get(resource)
            if held is None or held.token == step.token:
                return None
            left = held.deadline - now
            if left >= RIDE_MARGIN:
                if home is not None and held.home is home:
                    if step.waiter not in held.riders:
                        held.riders.append(step.waiter)
                    return Attempt(False, pttl_ms=int(left * 1000))
                if step.waiter in held.riders:
                    held.riders.remove(step.waiter)  # it queues itself now: the release must not
                return None
            del self.held[resource]  # over, as far as we know: its riders try for themselves
            over = [r for r in held.riders if r != step.waiter]
        self._unride(resource, over)
        return None

    def riding(self, resource: str) -> int:
        """How many of our waiters ride on our holder of ``resource`` (not yet in Redis's
        line: ``inspect`` adds them to the line it reads)."""
        with self._mutex:
            held = self.held.get(resource)
            return len(held.riders) if held is not None else 0

    def hold(self, resource: str, token: str, ttl_ms: int, since: float, home: object) -> None:
        """Record (or renew) ``token``'s hold, granted at ``since``; the riders of a hold
        it replaces (that one is over) try for themselves."""
        with self._mutex:
            replaced = self._record(resource, token, ttl_ms, since, home)
        self._unride(resource, replaced)

    def _record(
        self, resource: str, token: str, ttl_ms: int, since: float, home: object
    ) -> Sequence[str]:
        held = self.held.get(resource)
        if held is not None and held.token == token:
            held.deadline = since + ttl_ms / 1000
            return ()
        self.held[resource] = LocalHolder(token, since + ttl_ms / 1000, home)
        return held.riders if held is not None else ()

    def extended(self, resource: str, token: str, ttl_ms: int, since: float, ok: bool) -> None:
        """After an extend of ``token``'s lease sent at ``since``: renew the hold, or
        (refused: the lease is over) forget it and let its riders try for themselves."""
        with self._mutex:
            held = self.held.get(resource)
            if held is None or held.token != token:
                return
            if ok:
                held.deadline = since + ttl_ms / 1000
                return
            del self.held[resource]
        self._unride(resource, held.riders)

    def releasing(self, resource: str, token: str) -> Release:
        """Forget ``token``'s hold as its release is sent; returns the release in flight,
        with the riders it is to queue."""
        with self._mutex:
            held = self.held.get(resource)
            if held is None or held.token != token:
                return _NOBODY
            del self.held[resource]
            if not held.riders:
                return _NOBODY
            release = Release(held.riders)
            self._releasing.setdefault(resource, []).append(release)
            return release

    def released(
        self, resource: str, release: Release, reply: Any, since: float, node: str, home: object
    ) -> Sequence[str]:
        """After ``release``'s reply (None if it failed): the waiter handed the lock holds
        it (if it is ``node``'s) and is told; riders not queued try for themselves, or
        ride on the new holder's release if the script left them to us.

        Returns the riders that gave up meanwhile: the caller sends their leave now
        (on an ordered connection they have sent it already).
        """
        to = handed_to(reply)
        if to is None and reply and release is _NOBODY:
            return ()  # the common case: released, nobody waited
        unride: list[str] = []
        with self._mutex:
            gone = release.gone
            if release is not _NOBODY:
                self._releasing[resource].remove(release)
                if not self._releasing[resource]:
                    del self._releasing[resource]
            if not reply:  # failed, or the lease had ended: it queued nobody
                unride = [r for r in release.riders if r not in gone]
            left: list[str] = []
            if to is not None and to[2]:  # the script left the riders to us
                left = [r for r in release.riders if r != to[0] and r not in gone]
            if to is not None and to[0] in gone:
                to = None  # it leaves after this release, which releases the lock again
            holder = None
            if to is not None:
                next_token, ttl_ms, owner = parse_waiter(to[0])
                if owner == node:
                    unride += self._record(resource, next_token, ttl_ms, since, home)
                    holder = self.held[resource]
            if holder is not None:
                holder.riders[:0] = left  # ahead of any that asked since: they asked first
            else:
                unride += left
        if to is not None:  # if the waiter is one of ours, tell it
            self._waker.hand(lock_keys(resource, self._sharded).channel, to[0], to[1])
        self._unride(resource, unride)
        return () if self._ordered else gone

    def leave(self, resource: str, waiter: str) -> bool:
        """Before ``waiter`` leaves: True to send its leave now, False if a release in
        flight queues it (its caller sends the leave after it: never ahead of it). On an
        ordered connection it is always True (the leave follows the release); the
        release still learns that the waiter is gone."""
        unride: Sequence[str] = ()
        with self._mutex:
            for release in self._releasing.get(resource, ()):
                if waiter in release.riders:
                    release.gone.append(waiter)
                    return self._ordered
            held = self.held.get(resource)
            if held is not None:
                if waiter in held.riders:
                    held.riders.remove(waiter)  # an earlier release may have queued it
                elif waiter.startswith(held.token + ":"):
                    # Handed the lock as it left: the leave script releases it and hands
                    # it on in Redis, without our riders, who try for themselves.
                    del self.held[resource]
                    unride = held.riders
        self._unride(resource, unride)
        return True

    def _unride(self, resource: str, riders: Sequence[str]) -> None:
        """Tell ``riders`` that no release queued them: each tries for itself."""
        if riders:
            channel = lock_keys(resource, self._sharded).channel
            for rider in riders:
                self._waker.hand(channel, rider, None)
