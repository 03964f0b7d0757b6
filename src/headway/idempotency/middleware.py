"""``IdempotencyMiddleware`` (pure ASGI) and the ``idempotent`` per-route decorator: the
HTTP face (methods, the key header, the request body, the app's run captured, 503s) of
the idempotency engine (``engine``)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection
from typing import Any

from headway._errors import BackendUnavailable, LockLost
from headway._http import ASGIApp, Receive, Scope, Send, header_values, send_problem
from headway.idempotency.answers import answer_unavailable, send_answer
from headway.idempotency.callers import ScopeFunction, by_credentials, identify
from headway.idempotency.capture import BodyTooLarge, Capture, read_body, replaying
from headway.idempotency.contract import RecordBackend
from headway.idempotency.engine import Call, Engine
from headway.idempotency.events import IdempotencyHook
from headway.idempotency.fingerprints import (
    FingerprintFunction,
    default_fingerprint,
    earlier_fingerprint,
    request_fingerprint,
)
from headway.idempotency.record import StoredResponse
from headway.idempotency.request import InvalidKey, parse_key, storable_headers
from headway.idempotency.store import RecordStore
from headway.lock.backends.memory import MemoryLockBackend
from headway.lock.contract import LockBackend

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

    Records are filed per caller (``scope_function``). Another caller's key is
    invisible: its request runs as its own. A caller named None (or a scope function
    that fails) is unnamed: its key runs once and any request reusing it gets 409
    ``idempotency-key-unverified``, never a replay.

    429 responses are never stored, nor 5xx unless ``store_server_errors``: the record
    is released so a retry runs again. When the database or the lock backend is down
    the answer is 503 with ``Retry-After`` and nothing is recorded.

    Args:
        app: The ASGI app behind the middleware.
        store: Where the records live; default None: a SQLite file
            (``headway.sqlite3``), one process. In production a ``RecordStore`` on
            PostgreSQL; a store of your own implements ``RecordBackend``.
        lock_backend: The lock taken beside each claim; default None: a
            ``MemoryLockBackend``, one process. In production a ``RedisLockBackend``.
        methods: The HTTP methods honouring the header; default ``("POST", "PATCH")``.
        required: Answer 400 to a request of ``methods`` without a key; default False.
        scope_function: Names the caller (sync or async; None when it cannot tell);
            default ``by_credentials``, a hash of the ``Authorization`` header. The
            rate-limit identities (``SessionCookie("sid")``, ``ApiKey(...)``,
            ``AuthenticatedUser()``, ``ClientAddress(trusted_proxies=...)``) fit too.
        lease_ttl: The first request's lease in seconds (> 0, at most a week),
            renewed every third of it while it runs; default 5.0.
        wait: How long a duplicate in flight waits for the first to finish and
            replays it, in seconds (>= 0); default 0.0: it gets 409 at once.
        max_body: Responses up to this many bytes are stored whole; a larger one is
            recorded as done without its body, and a retry gets 410 (the request is
            never run twice). Default 1 MiB.
        max_request_body: A request body over this many bytes gets 413 before
            anything runs (it is read whole to fingerprint it); default 10 MiB.
        store_server_errors: Store 5xx responses too (else the key is released for a
            retry); default False.
        retry_after: The ``Retry-After`` of a 503 (a backend down), in seconds;
            default 1.
        database_fallback: Survive a lock backend outage by excluding on the record's
            primary key and its database lease alone; default False (503).
        on_event: An ``IdempotencyHook`` told of every claimed, replayed, completed,
            released, conflict and key_reused outcome (``IdempotencyEvent``,
            ``source="http"``); its errors are logged and swallowed. Default None.
        fingerprint: Says when a retry is the same request; default
            ``default_fingerprint``: a JSON body compared as data (see
            ``fingerprints``). If it raises, the client gets a 500 problem and nothing
            runs.

    Raises:
        ValueError: A bad ``lease_ttl`` or ``wait``.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: RecordBackend | None = None,
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
        fingerprint: FingerprintFunction = default_fingerprint,
    ) -> None:
        self.app = app
        self.methods = frozenset(m.upper() for m in methods)
        self.required = required
        self.scope_function = scope_function
        self.max_body = max_body
        self.max_request_body = max_request_body
        self.store_server_errors = store_server_errors
        self.retry_after = str(retry_after).encode()
        self.fingerprint = fingerprint
        #: The records, the lock and their options (it validates ``lease_ttl`` and ``wait``).
        self.engine = Engine(
            store=store or RecordStore.from_url("sqlite+aiosqlite:///headway.sqlite3"),
            lock_backend=lock_backend or MemoryLockBackend(), source="http",
            lease_ttl=lease_ttl, wait=wait, on_event=on_event, database_fallback=database_fallback,
        )  # fmt: skip

    _warned = False

    def _warn_unnamed(self) -> None:
        """Say once per middleware that callers go unnamed (their keys are never replayed)."""
        if not self._warned:
            self._warned = True
            log.warning(
                "an Idempotency-Key request came from a caller the scope function %r could "
                "not name: such keys run once and are never replayed (409 on a retry). "
                "Name callers with scope_function= "
                "(docs/idempotency.md#callers-who-may-receive-a-stored-response)",
                getattr(self.scope_function, "__qualname__", self.scope_function),
            )

    async def _call(self, scope: Scope, key: str, body: bytes, send: Send) -> Call | None:
        """The engine's call: who calls (the scope function) and what (the fingerprint);
        None when the fingerprint function failed (the client was answered 500)."""
        digest = await request_fingerprint(self.fingerprint, scope, body, send)
        if digest is None:
            return None
        caller = await identify(self.scope_function, scope)
        if not caller.named:
            self._warn_unnamed()
        earlier = None
        if self.fingerprint is default_fingerprint:
            earlier = functools.partial(earlier_fingerprint, scope, body)
        return Call(caller.id, key, digest, named=caller.named, earlier=earlier)

    async def _key(self, scope: Scope, values: list[bytes], send: Send) -> str | None:
        """The request's Idempotency-Key; None once a 400 said why there is none."""
        if not values:
            await send_problem(
                send, 400, "idempotency-key-missing", "Idempotency-Key required",
                f"{scope['method']} {scope['path']} needs an Idempotency-Key header.",
            )  # fmt: skip
            return None
        try:
            return parse_key(values)
        except InvalidKey as exc:
            await send_problem(
                send, 400, "idempotency-key-malformed", "Malformed Idempotency-Key", str(exc)
            )
            return None

    async def _body(self, receive: Receive, send: Send) -> bytes | None:
        """The whole request body; None if it is too large (answered 413) or the client
        left before sending it."""
        try:
            return await read_body(receive, self.max_request_body)
        except BodyTooLarge:
            await send_problem(
                send, 413, "idempotency-request-too-large", "Request Too Large",
                f"A request with an Idempotency-Key may carry at most {self.max_request_body} "
                "bytes: its body is read whole to fingerprint it. Nothing was done.",
            )  # fmt: skip
            return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in self.methods:
            await self.app(scope, receive, send)
            return
        values = header_values(scope, HEADER)
        if not values and not self.required:
            await self.app(scope, receive, send)
            return
        key = await self._key(scope, values, send)
        if key is None:
            return  # answered 400
        body = await self._body(receive, send)
        if body is None:
            return  # too large (answered 413), or the client left before sending it
        call = await self._call(scope, key, body, send)
        if call is None:
            return  # the fingerprint function failed: answered 500
        run = AppRun(self, scope, replaying(body, receive), send)
        try:
            answer = await self.engine.execute(call, run)
        except (BackendUnavailable, LockLost) as exc:
            if run.capture is not None and run.capture.started:
                raise  # the client already has part of a response: it can only be cut
            await answer_unavailable(exc, send, self.retry_after)
            return
        if answer is not None:
            await send_answer(answer, send)


class AppRun:
    """The engine's work for one request: run the app, its response captured (``Work``)."""

    __slots__ = ("capture", "middleware", "receive", "scope", "send")

    def __init__(
        self, middleware: IdempotencyMiddleware, scope: Scope, receive: Receive, send: Send
    ) -> None:
        self.middleware = middleware
        self.scope = scope
        self.receive = receive
        self.send = send
        self.capture: Capture | None = None  # set once the app runs

    async def run(self) -> StoredResponse | None:
        """Run the app; its response to store, or None when the record is to be released."""
        capture = self.capture = Capture(self.send, self.middleware.max_body)
        await self.middleware.app(self.scope, self.receive, capture.send)
        status = capture.status
        # 429: refused before it ran (say, by a rate limiter mounted inside): a retry must
        # run, not replay the refusal. 5xx: the work most likely did not happen either.
        if status is None or status == 429:
            return None
        if status >= 500 and not self.middleware.store_server_errors:
            return None
        return StoredResponse(status, storable_headers(capture.headers), capture.body)

    async def finish(self) -> None:
        """The end of the response, held back until its record settled."""
        assert self.capture is not None
        await self.capture.finish()


def idempotent(**options: Any) -> Callable[[Callable[..., Any]], ASGIApp]:
    """Make one Starlette endpoint idempotent (same options as ``IdempotencyMiddleware``).

    ``Route("/payments", idempotent(store=store, required=True)(create), methods=["POST"])``
    """

    def wrap(endpoint: Callable[..., Any]) -> ASGIApp:
        from starlette.routing import request_response

        return IdempotencyMiddleware(request_response(endpoint), **options)

    return wrap
