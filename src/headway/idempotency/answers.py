"""What the idempotency middleware answers without running the app: a replay, 410,
422, 409 with ``Retry-After``, and 503 when a backend or the lease failed; and
``KeyedRequest``, the request with a key those answers are about."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from headway._errors import BackendUnavailable, DatabaseNotMigrated, LockLost
from headway._http import Send, send_problem, send_response
from headway.idempotency.capture import Capture
from headway.idempotency.events import IdempotencyHook
from headway.idempotency.hooks import emit
from headway.idempotency.record import Record
from headway.idempotency.request import replay_headers
from headway.idempotency.table import Status

__all__ = ["KeyedRequest", "answer_in_use", "answer_record", "answer_unavailable"]

log = logging.getLogger("headway.idempotency")


class KeyedRequest:
    """One request with a key; ``capture`` is set once its app runs."""

    __slots__ = ("caller", "capture", "earlier", "fingerprint", "key", "named", "sent")

    def __init__(
        self,
        caller: str,
        key: str,
        fingerprint: str,
        *,
        named: bool = True,
        earlier: Callable[[], str] | None = None,
    ) -> None:
        self.caller = caller  # the stored scope (``callers.Caller.scope``)
        self.named = named  # False: the UNVERIFIED partition, where nothing is replayed
        self.key = key
        self.fingerprint = fingerprint
        # The fingerprint an earlier release stored for this request, computed only if
        # a record does not match ``fingerprint`` (``fingerprints.earlier_fingerprint``).
        self.earlier = earlier
        self.capture: Capture | None = None
        self.sent = 0.0  # when the last claim was sent (monotonic clock)

    @property
    def resource(self) -> str:
        """The lock resource (and what a lost lease names)."""
        return f"idempotency/{self.caller}/{self.key}"

    def matches(self, stored: str) -> bool:
        """Whether a record's fingerprint is this request's (now, or as stored before)."""
        return stored == self.fingerprint or (self.earlier is not None and stored == self.earlier())

    @property
    def responded(self) -> bool:
        """Whether the client has seen the start of the app's response."""
        return self.capture is not None and self.capture.started


async def answer_record(
    record: Record, request: KeyedRequest, send: Send, on_event: IdempotencyHook | None
) -> bool:
    """Answer from an existing record: 422, a replay or 410; False if still in flight.

    For an unnamed caller, any record is answered 409 ``idempotency-key-unverified``:
    it may be another caller's, so neither its response nor its fingerprint is told.
    """
    if not request.named:
        await emit(on_event, "conflict", request.caller, request.key)
        await send_problem(
            send, 409, "idempotency-key-unverified", "Idempotency-Key already used",
            "A request with this Idempotency-Key was already made, and the server cannot "
            "tell whether it was yours: it is neither run again nor replayed. "
            "Authenticate, or use a new key.",
        )  # fmt: skip
        return True
    if not request.matches(record.fingerprint):
        await emit(on_event, "key_reused", request.caller, request.key)
        await send_problem(
            send, 422, "idempotency-key-reused", "Idempotency-Key reused",
            "This Idempotency-Key was already used for a different request.",
        )  # fmt: skip
        return True
    if record.status is not Status.COMPLETED or record.response is None:
        return False
    response = record.response
    await emit(on_event, "replayed", request.caller, request.key, record.fence)
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


async def answer_in_use(
    request: KeyedRequest, seconds: float, send: Send, on_event: IdempotencyHook | None
) -> None:
    """409, with ``Retry-After``: ``seconds`` until the holder's lease ends at the latest."""
    await emit(on_event, "conflict", request.caller, request.key)
    await send_problem(
        send, 409, "idempotency-key-in-use", "Request in progress",
        "A request with this Idempotency-Key is still being processed. Retry later.",
        headers=[(b"retry-after", str(max(1, math.ceil(seconds))).encode())],
    )  # fmt: skip


async def answer_unavailable(
    exc: BackendUnavailable | LockLost, send: Send, retry_after: bytes
) -> None:
    """503: a backend could not answer, or the request lost its lease; nothing is stored."""
    if isinstance(exc, LockLost):
        log.warning("lease lost on an idempotent request; its response is not stored")
        problem = "idempotency-lease-lost"
        detail = "The request lost its lock before it finished; nothing was stored. Retry."
    else:
        if not isinstance(exc, DatabaseNotMigrated):  # the store logs that, not per request
            log.warning("idempotency unavailable (%s): %s", exc.backend, exc)
        problem = f"idempotency-{exc.backend}-unavailable"
        detail = "The idempotency record could not be checked; nothing was done. Retry later."
    await send_problem(
        send, 503, problem, "Service Unavailable", detail,
        headers=[(b"retry-after", retry_after)],
    )  # fmt: skip
