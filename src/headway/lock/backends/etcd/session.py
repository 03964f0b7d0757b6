"""Session leases: one etcd lease per whole-second TTL, kept alive for every key under it.

etcd's ``concurrency`` package binds every lock of a client to one session lease; so
do we, with one session per distinct TTL (in whole seconds) a backend is asked for, so
a process that stops or dies loses each lock about its own TTL after its last sign of
life. A ``Session`` keeps its lease alive in the background every third of its TTL and
knows ``expiry``: a time on our clock before which the server cannot have ended the
lease (the send time of the last keep-alive it answered, plus the TTL it granted). A
lock's lease deadline must never pass it, so an acquire or extend that needs more
asks for a keep-alive (``cover``), shared with any other already on its way.

A session whose keep-alive is refused, or that heard nothing until ``expiry``, is lost:
every key under it is gone (or soon will be), and ``on_lost`` is told. An idle session
(no keys for a third of its TTL) is revoked; the next acquire grants a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
from collections.abc import Callable

from headway._clock import Clock
from headway._errors import BackendUnavailable
from headway.lock.backends.etcd.codec import FAILED_PRECONDITION, NOT_FOUND, EtcdError
from headway.lock.backends.etcd.transport import Transport

__all__ = ["Session", "Sessions"]

#: After a keep-alive failed (no answer), try again this often (s) until ``expiry``.
_RETRY = 0.2


class Session:
    """One lease, kept alive while keys are bound to it."""

    def __init__(self, owner: Sessions, ttl: int, lease: int, granted: int, sent: float) -> None:
        self.owner, self.ttl, self.lease, self.granted = owner, ttl, lease, granted
        #: Before this time (on our clock) the server still has the lease.
        self.expiry = sent + granted
        self.lost = False
        #: The tokens whose keys are bound to this lease (holding or waiting).
        self.tokens: set[str] = set()
        self.used = sent
        self._renewal: asyncio.Task[None] | None = None
        self._renewal_sent = 0.0
        self._task = asyncio.create_task(self._keep())

    def alive(self) -> bool:
        """True while the server certainly has the lease. Past ``expiry`` the session is
        lost for good, even if the server still has it: a keep-alive that found it then
        would keep alive keys we already gave up (so it is revoked instead)."""
        if not self.lost and self.owner.clock() >= self.expiry:
            self.lose()
        return not self.lost

    async def cover(self, until: float) -> bool:
        """Make sure the lease lasts until ``until`` (our clock): True if it does, False if
        the session is lost. Sends a keep-alive only if ``expiry`` falls short, and shares
        one already sent late enough."""
        while self.alive() and self.expiry < until:
            renewal = self._renewal
            if renewal is None or self._renewal_sent + self.granted < until:
                renewal = self._renew()
            await asyncio.shield(renewal)
            if self.expiry < until:  # granted less than asked: cannot cover it
                return self.alive() and self.expiry >= until
        return self.alive()

    def _renew(self) -> asyncio.Task[None]:
        self._renewal_sent = self.owner.clock()
        task = self._renewal = asyncio.create_task(self._keepalive(self._renewal_sent))
        task.add_done_callback(self._renewed)
        return task

    def _renewed(self, task: asyncio.Task[None]) -> None:
        if self._renewal is task:
            self._renewal = None
        if not task.cancelled():
            task.exception()  # retrieved: whoever awaited it has seen it

    async def _keepalive(self, sent: float) -> None:
        try:
            reply = await self.owner.transport.call("lease/keepalive", {"ID": str(self.lease)})
        except EtcdError as exc:
            if exc.code != NOT_FOUND:
                raise
            reply = {}
        ttl = int(reply.get("TTL", 0))
        if ttl <= 0:
            self.lose()
        elif self.alive():  # not revived once lost
            self.expiry = max(self.expiry, sent + ttl)

    async def _keep(self) -> None:
        """Keep the lease alive every third of its TTL; revoke it once idle."""
        while True:
            last = self.expiry - self.granted  # when the last answered keep-alive was sent
            await asyncio.sleep(max(0.0, last + self.granted / 3 - self.owner.clock()))
            if self.lost:
                return
            if not self.tokens and self.owner.clock() - self.used >= self.granted / 3:
                await self.owner.retire(self)
                return
            try:
                await asyncio.shield(self._renewal or self._renew())
            except (BackendUnavailable, EtcdError):
                if not self.alive():
                    self.lose()
                    return
                await asyncio.sleep(_RETRY)

    def lose(self) -> None:
        """The lease is gone, or may be: so is every key under it."""
        if self.lost:
            return
        self.lost = True
        self.owner.lost(self)

    def stop(self) -> None:
        """Stop keeping the lease alive."""
        self._task.cancel()


class Sessions:
    """A backend's sessions, one per TTL in whole seconds."""

    def __init__(self, transport: Transport, clock: Clock, on_lost: Callable[[Session], None]):
        self.transport, self.clock, self._on_lost = transport, clock, on_lost
        self._live: dict[int, Session] = {}
        self._granting: dict[int, asyncio.Task[Session]] = {}
        self._revoking: set[asyncio.Task[None]] = set()

    async def get(self, ttl: int, token: str) -> Session:
        """The live session of ``ttl`` seconds, granted if there is none, with ``token``
        bound to it (before any other task can see it idle)."""
        while True:
            session = self._live.get(ttl)
            if session is not None and session.alive():
                session.tokens.add(token)
                session.used = self.clock()
                return session
            granting = self._granting.get(ttl)
            if granting is None:
                granting = self._granting[ttl] = asyncio.create_task(self._grant(ttl))
                granting.add_done_callback(functools.partial(self._granted, ttl))
            await asyncio.shield(granting)

    def _granted(self, ttl: int, task: asyncio.Task[Session]) -> None:
        self._granting.pop(ttl, None)
        if not task.cancelled():
            task.exception()  # retrieved: the callers that awaited it have seen it

    async def _grant(self, ttl: int) -> Session:
        lease = secrets.randbits(62) + 1
        sent = self.clock()
        try:
            reply = await self.transport.call("lease/grant", {"ID": str(lease), "TTL": str(ttl)})
            granted = int(reply.get("TTL", ttl))
        except EtcdError as exc:
            # A grant sent again after a lost reply finds its own lease: that is fine.
            if exc.code != FAILED_PRECONDITION:
                raise
            granted = ttl
        session = self._live[ttl] = Session(self, ttl, lease, granted, sent)
        return session

    def lost(self, session: Session) -> None:
        if self._live.get(session.ttl) is session:
            del self._live[session.ttl]
        session.stop()
        self._on_lost(session)
        # The server may still have it (we only stopped hearing back): end it now.
        task = asyncio.create_task(self._revoke(session))
        self._revoking.add(task)
        task.add_done_callback(self._revoked)

    async def retire(self, session: Session) -> None:
        """Revoke an idle session (no key is bound to it)."""
        if self._live.get(session.ttl) is session:
            del self._live[session.ttl]
        session.lost = True
        await self._revoke(session)

    async def _revoke(self, session: Session) -> None:
        with contextlib.suppress(EtcdError):
            await self.transport.call("lease/revoke", {"ID": str(session.lease)})

    def _revoked(self, task: asyncio.Task[None]) -> None:
        self._revoking.discard(task)
        if not task.cancelled():
            task.exception()

    async def aclose(self, keep: set[Session]) -> None:
        """Stop every session: revoke those not in ``keep`` (deleting their keys); renew
        those in ``keep`` once and leave them to run out on the server."""
        sessions = list(self._live.values())
        self._live.clear()
        for session in sessions:
            session.stop()
        await asyncio.gather(
            *(s._keepalive(self.clock()) if s in keep else self._revoke(s) for s in sessions),
            return_exceptions=True,
        )
        for session in sessions:
            session.lost = True
