"""``IdempotencyMiddleware`` (pure ASGI) and the ``idempotent`` per-route decorator."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Collection
from typing import Any

from headway._errors import BackendUnavailable, LockLost, LockNotAcquired, LockNotOwned
from headway._http import ASGIApp, Receive, Scope, Send, header_values, send_problem, send_response
from headway.idempotency.capture import BodyTooLarge, Capture, read_body, replaying
from headway.idempotency.events import IdempotencyHook
from headway.idempotency.hooks import emit
from headway.idempotency.record import Claim, ClaimOutcome, Record, StoredResponse
from headway.idempotency.renewal import RequestLeases
from headway.idempotency.request import (
    InvalidKey,
    ScopeFunction,
    by_credentials,
    fingerprint,
    parse_key,
    replay_headers,
    scope_id,
    storable_headers,
)
from headway.idempotency.store import RecordStore
from headway.idempotency.table import Status
from headway.lock.backends.memory import MemoryLockBackend
from headway.lock.contract import LockBackend
from headway.lock.driver import complete
from headway.lock.lease import Lease, new_token
from headway.lock.lock import Lock

__all__ = ["IdempotencyMiddleware", "idempotent"]

log = logging.getLogger("headway.idempotency")

HEADER = b"idempotency-key"


class IdempotencyMiddleware:
    """Honour ``Idempotency-Key`` on ``methods`` (draft-ietf-httpapi-idempotency-key-header).

    The first request with a key claims its record (one statement, the lock taken
    alongside), runs under a lease of ``lease_ttl`` s renewed every third of it, and
    its response is stored with a fenced write; a retry gets that response
    back with ``Idempotent-Replayed: true``. A duplicate in flight gets 409 with
    ``Retry-After`` saying when the holder's lease ends at the latest (a dead
    worker's key runs again after that), or, with ``wait`` > 0 s, waits up to that
    long for the first to finish and replays it; the same key on a different
    request gets 422, a missing key (when ``required``) or a malformed one 400, all
    as ``application/problem+json``.

    ``store`` defaults to a SQLite file (``headway.sqlite3``) and
    ``lock_backend`` to the in-memory backend: one process. In production use
    a ``RecordStore`` on PostgreSQL and a ``RedisLockBackend``.

    Responses up to ``max_body`` bytes are stored whole; a larger one is
    recorded as done without its body, and a retry gets 410 (the request is
    never run twice). A request body over ``max_request_body`` bytes gets 413
    before anything runs (it is read whole to fingerprint it). 429 responses are never
    stored, and 5xx only with ``store_server_errors``: the record is released so a retry
    runs again.
    When the database or the lock backend is down the answer is 503 with
    ``Retry-After`` and nothing is recorded; with ``database_fallback`` a lock
    backend outage is survived by excluding on the record's primary key and
    its database lease alone. ``on_event`` is told of every claimed, replayed,
    completed, released, conflict and key_reused outcome (``IdempotencyEvent``,
    ``source="http"``); its errors are logged and swallowed.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: RecordStore | None = None,
        lock_backend: LockBackend | None = None,
        methods: Collection[str] = ("POST", "PATCH"),
        required: bool = False,
        scope_function: ScopeFunction = by_credentials,
        lease_ttl: float = 5.0,
        wait: float = 0.0,
        max_body: int = 1 << 20,
        max_request_body: int = 10 << 20,
        store_server_errors: bool = False,
        retry_after: int = 1,
        database_fallback: bool = False,
        on_event: IdempotencyHook | None = None,
    ) -> None:
        self.app = app
        self.store = store or RecordStore.from_url("sqlite+aiosqlite:///headway.sqlite3")
        self.lock_backend = lock_backend or MemoryLockBackend()
        self.methods = frozenset(m.upper() for m in methods)
        self.required = required
        self.scope_function = scope_function
        self.lease_ttl = lease_ttl
        self.wait = wait
        self.max_body = max_body
        self.max_request_body = max_request_body
        self.store_server_errors = store_server_errors
        self.retry_after = str(retry_after).encode()
        self.database_fallback = database_fallback
        self.on_event = on_event
        Lock(self.lock_backend, "check", ttl=lease_ttl, timeout=wait)  # validates both

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in self.methods:
            await self.app(scope, receive, send)
            return
        values = header_values(scope, HEADER)
        if not values:
            if self.required:
                await send_problem(
                    send, 400, "idempotency-key-missing", "Idempotency-Key required",
                    f"{scope['method']} {scope['path']} needs an Idempotency-Key header.",
                )  # fmt: skip
            else:
                await self.app(scope, receive, send)
            return
        try:
            key = parse_key(values)
        except InvalidKey as exc:
            await send_problem(
                send, 400, "idempotency-key-malformed", "Malformed Idempotency-Key", str(exc)
            )
            return
        try:
            body = await read_body(receive, self.max_request_body)
        except BodyTooLarge:
            await send_problem(
                send, 413, "idempotency-request-too-large", "Request Too Large",
                f"A request with an Idempotency-Key may carry at most {self.max_request_body} "
                "bytes: its body is read whole to fingerprint it. Nothing was done.",
            )  # fmt: skip
            return
        if body is None:
            return  # the client left before sending its request
        caller = scope_id(self.scope_function(scope))
        request = _Request(caller, key, fingerprint(scope, body))
        try:
            await self._handle(request, scope, replaying(body, receive), send)
        except (BackendUnavailable, LockLost) as exc:
            if request.responded:
                raise  # the client already has part of a response: it can only be cut
            await self._unavailable(exc, send)

    async def _unavailable(self, exc: BackendUnavailable | LockLost, send: Send) -> None:
        """503: a backend could not answer, or the request lost its lease; nothing is stored."""
        if isinstance(exc, LockLost):
            log.warning("lease lost on an idempotent request; its response is not stored")
            problem = "idempotency-lease-lost"
            detail = "The request lost its lock before it finished; nothing was stored. Retry."
        else:
            log.warning("idempotency unavailable (%s): %s", exc.backend, exc)
            problem = f"idempotency-{exc.backend}-unavailable"
            detail = "The idempotency record could not be checked; nothing was done. Retry later."
        await send_problem(
            send, 503, problem, "Service Unavailable", detail,
            headers=[(b"retry-after", self.retry_after)],
        )  # fmt: skip

    async def _handle(self, request: _Request, scope: Scope, receive: Receive, send: Send) -> None:
        record = await self.store.get(request.caller, request.key)
        if record is not None and await self._answer(record, request, send):
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
            if record is None or not await self._answer(record, request, send):
                await self._in_use(request, None, send)
            return
        except BaseException:
            await _abandon(acquiring, lock)
            raise
        try:
            if claim.outcome is ClaimOutcome.CLAIMED:
                await self._claimed(request, claim, lock, lease, scope, receive, send)
            elif claim.record is None or not await self._answer(claim.record, request, send):
                await self._in_use(request, claim.lease_left, send)
        finally:
            if lease is not None:
                await _release(lock, lease)

    async def _locked(
        self, acquiring: asyncio.Future[Lease], claim: Claim | None, request: _Request | None = None
    ) -> Lease | None:
        """The lock lease, once taken; None when running without it.

        After a ``claim`` (no ``wait``), a lock held elsewhere gives None: a record this
        request claimed runs under its own lease (the peer holding the lock found the
        record BUSY). A lock backend outage gives None with ``database_fallback`` or when
        nothing was claimed; otherwise the claimed record is given back and it is raised.
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
                await self.store.release(request.caller, request.key, claim.fence)
            raise

    async def _in_use(self, request: _Request, lease_left: float | None, send: Send) -> None:
        """409, with ``Retry-After`` when the holder's lease ends at the latest."""
        await emit(self.on_event, "conflict", request.caller, request.key)
        seconds = self.lease_ttl if lease_left is None else lease_left
        await send_problem(
            send, 409, "idempotency-key-in-use", "Request in progress",
            "A request with this Idempotency-Key is still being processed. Retry later.",
            headers=[(b"retry-after", str(max(1, math.ceil(seconds))).encode())],
        )  # fmt: skip

    async def _claimed(
        self,
        request: _Request,
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

    async def _answer(self, record: Record, request: _Request, send: Send) -> bool:
        """Answer from an existing record: 422, a replay or 410; False if still in flight."""
        if record.fingerprint != request.fingerprint:
            await emit(self.on_event, "key_reused", request.caller, request.key)
            await send_problem(
                send, 422, "idempotency-key-reused", "Idempotency-Key reused",
                "This Idempotency-Key was already used for a different request.",
            )  # fmt: skip
            return True
        if record.status is not Status.COMPLETED or record.response is None:
            return False
        response = record.response
        await emit(self.on_event, "replayed", request.caller, request.key, record.fence)
        if response.body is None:
            await send_problem(
                send, 410, "idempotency-response-not-stored", "Response not stored",
                "This request was already processed, but its response was too large to keep; "
                "it will not be run again.",
                headers=[(b"idempotent-replayed", b"true")],
                original_status=response.status,
            )  # fmt: skip
            return True
        await send_response(send, response.status, replay_headers(response.headers), response.body)
        return True

    async def _run(
        self, request: _Request, fence: int, scope: Scope, receive: Receive, send: Send
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


class _Request:
    """One request with a key; ``capture`` is set once its app runs."""

    __slots__ = ("caller", "capture", "fingerprint", "key", "sent")

    def __init__(self, caller: str, key: str, fingerprint: str) -> None:
        self.caller = caller
        self.key = key
        self.fingerprint = fingerprint
        self.capture: Capture | None = None
        self.sent = 0.0  # when the last claim was sent (monotonic clock)

    @property
    def resource(self) -> str:
        """The lock resource (and what a lost lease names)."""
        return f"idempotency/{self.caller}/{self.key}"

    @property
    def responded(self) -> bool:
        """Whether the client has seen the start of the app's response."""
        return self.capture is not None and self.capture.started


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


def idempotent(**options: Any) -> Callable[[Callable[..., Any]], ASGIApp]:
    """Make one Starlette endpoint idempotent (same options as ``IdempotencyMiddleware``).

    ``Route("/payments", idempotent(store=store, required=True)(create), methods=["POST"])``
    """

    def wrap(endpoint: Callable[..., Any]) -> ASGIApp:
        from starlette.routing import request_response

        return IdempotencyMiddleware(request_response(endpoint), **options)

    return wrap
