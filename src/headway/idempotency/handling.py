"""How the idempotency middleware handles a request with a key: the record read, the
claim (the lock requested alongside), the app run under both leases, and the fenced
completion or release. ``IdempotencyMiddleware`` (``middleware``) is this engine
behind its HTTP face; the answers it sends without running the app are in ``answers``.
"""

from __future__ import annotations

import asyncio
import logging
import time

from headway._errors import BackendUnavailable, LockLost, LockNotAcquired, LockNotOwned
from headway._http import ASGIApp, Receive, Scope, Send
from headway.idempotency.answers import KeyedRequest, answer_in_use, answer_record
from headway.idempotency.capture import Capture
from headway.idempotency.events import IdempotencyHook
from headway.idempotency.hooks import emit
from headway.idempotency.record import Claim, ClaimOutcome, StoredResponse
from headway.idempotency.renewal import RequestLeases
from headway.idempotency.request import storable_headers
from headway.idempotency.store import RecordStore
from headway.lock.contract import LockBackend
from headway.lock.driver import complete
from headway.lock.lease import Lease, new_token
from headway.lock.lock import Lock

__all__ = ["KeyedHandling"]

log = logging.getLogger("headway.idempotency")


class KeyedHandling:
    """The engine of ``IdempotencyMiddleware``: ``handle`` one request with a key.

    The options it reads are the middleware's (its docstring says what they mean).
    """

    app: ASGIApp
    store: RecordStore
    lock_backend: LockBackend
    lease_ttl: float
    wait: float
    max_body: int
    store_server_errors: bool
    database_fallback: bool
    on_event: IdempotencyHook | None

    async def handle(
        self, request: KeyedRequest, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Replay, refuse, or claim the key and run the app once."""
        record = await self.store.get(request.caller, request.key)
        if record is not None and await answer_record(record, request, send, self.on_event):
            return
        lock = Lock(self.lock_backend, request.resource, ttl=self.lease_ttl, timeout=self.wait)
        # Without ``wait`` the lock's request overlaps the claim's: the record's primary key
        # and fence decide who runs, so neither round trip waits for the other. With it,
        # the lock comes first: it is what a duplicate waits on.
        acquiring = asyncio.ensure_future(lock.acquire())
        lease: Lease | None = None
        try:
            if self.wait > 0:
                lease = await self._locked(acquiring, None)
            request.sent = time.monotonic()
            claim = await self.store.claim(
                request.caller, request.key, request.fingerprint,
                fence=None, lease_token=new_token(), lease_ttl=self.lease_ttl,
            )  # fmt: skip
            if self.wait == 0:
                lease = await self._locked(acquiring, claim, request)
        except LockNotAcquired:  # waited in vain, or the holder finished meanwhile
            record = await self.store.get(request.caller, request.key)
            if record is None or not await answer_record(record, request, send, self.on_event):
                await answer_in_use(request, self.lease_ttl, send, self.on_event)
            return
        except BaseException:
            await _abandon(acquiring, lock)
            raise
        try:
            if claim.outcome is ClaimOutcome.CLAIMED:
                await self._claimed(request, claim, lock, lease, scope, receive, send)
            elif claim.record is None or not await answer_record(
                claim.record, request, send, self.on_event
            ):
                left = self.lease_ttl if claim.lease_left is None else claim.lease_left
                await answer_in_use(request, left, send, self.on_event)
        finally:
            if lease is not None:
                await _release(lock, lease)

    async def _locked(
        self,
        acquiring: asyncio.Future[Lease],
        claim: Claim | None,
        request: KeyedRequest | None = None,
    ) -> Lease | None:
        """The lock lease, once taken; None when running without it.

        After a ``claim`` (no ``wait``), a lock held elsewhere gives None: a record this
        request claimed runs under its own lease (the peer holding the lock found the
        record BUSY). A lock backend outage gives None with ``database_fallback`` or when
        nothing was claimed; otherwise the claimed record is given back (``released``)
        and it is raised.
        """
        try:
            return await acquiring
        except LockNotAcquired:
            if claim is None:
                raise
            return None
        except BackendUnavailable as exc:
            claimed = claim is not None and claim.outcome is ClaimOutcome.CLAIMED
            if self.database_fallback or (claim is not None and not claimed):
                log.warning("lock backend down, excluding by the database alone: %s", exc)
                return None
            if claimed and claim is not None and claim.fence is not None and request is not None:
                await self._give_back(request, claim.fence)
            raise

    async def _give_back(self, request: KeyedRequest, fence: int) -> None:
        """Release a record claimed for an app that will not run (the lock backend is down).

        ``released`` is emitted with no ``claimed`` before it: the execution never started.
        """
        if await self.store.release(request.caller, request.key, fence):
            await emit(self.on_event, "released", request.caller, request.key, fence)

    async def _claimed(
        self,
        request: KeyedRequest,
        claim: Claim,
        lock: Lock,
        lease: Lease | None,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Run the app on the record ``claim`` took, its lease (and the lock's) renewed."""
        assert claim.fence is not None
        await emit(self.on_event, "claimed", request.caller, request.key, claim.fence)
        # The record's lease counted from when the claim was sent: never later than the database's.
        deadline = request.sent + self.lease_ttl
        record = Lease(request.resource, "", claim.fence, deadline, self.lease_ttl)
        held = None if lease is None else (lock, lease)
        leases = RequestLeases(self.store, request.caller, request.key, record, held)
        async with leases.watchdog(self.lease_ttl):
            await self._run(request, claim.fence, scope, receive, send)

    async def _run(
        self, request: KeyedRequest, fence: int, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Run the app on our claimed record; store its response (fenced) or release the record."""
        capture = Capture(send, self.max_body)
        request.capture = capture
        try:
            await self.app(scope, receive, capture.send)
        except BaseException:
            try:
                if await complete(self.store.release(request.caller, request.key, fence)):
                    await emit(self.on_event, "released", request.caller, request.key, fence)
            except Exception as exc:  # the app's error matters more
                log.warning("could not release an idempotency record: %s", exc)
            raise
        status = capture.status
        # 429: refused before it ran (say, by a rate limiter mounted inside): a retry must
        # run, not replay the refusal. 5xx: the work most likely did not happen either.
        if status is None or status == 429 or (status >= 500 and not self.store_server_errors):
            if await self.store.release(request.caller, request.key, fence):
                await emit(self.on_event, "released", request.caller, request.key, fence)
        else:
            stored = StoredResponse(status, storable_headers(capture.headers), capture.body)
            if not await self.store.complete(request.caller, request.key, fence, stored):
                # A newer lease took over: this response must not reach the client whole.
                raise LockLost(
                    f"fence {fence} was superseded; the response was not stored",
                    resource=request.resource,
                )
            await emit(self.on_event, "completed", request.caller, request.key, fence)
        await capture.finish()


async def _abandon(acquiring: asyncio.Future[Lease], lock: Lock) -> None:
    """Give up the lock being taken (the claim failed): cancel it, or release what it took."""
    if not acquiring.done():
        acquiring.cancel()  # what it may still take lapses by its TTL
        return
    if not acquiring.cancelled() and acquiring.exception() is None:
        await _release(lock, acquiring.result())


async def _release(lock: Lock, lease: Lease) -> None:
    """Release the request's lock; a lapsed or unreachable lock expires by its TTL."""
    try:
        await lock.release(lease)
    except (LockNotOwned, BackendUnavailable) as exc:
        # The record settled under its own fenced writes: the lock's end changes nothing.
        log.warning("releasing %r failed; it expires by its TTL: %s", lease.resource, exc)
