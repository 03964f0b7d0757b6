"""What the idempotency middleware answers without running the app: the engine's
``Answer`` as a replay, 410, 422 or 409 (with ``Retry-After``), and 503 when a backend or
the lease failed. The engine (``engine``) has told ``on_event`` already."""

from __future__ import annotations

import logging
import math

from headway._errors import BackendUnavailable, DatabaseNotMigrated, LockLost
from headway._http import Send, send_problem, send_response
from headway.idempotency.engine import Answer, Found
from headway.idempotency.request import replay_headers

__all__ = ["answer_unavailable", "send_answer"]

log = logging.getLogger("headway.idempotency")


async def send_answer(answer: Answer, send: Send) -> None:
    """Send the engine's ``answer`` as a replay or a problem."""
    if answer.found is Found.UNVERIFIED:
        await send_problem(
            send, 409, "idempotency-key-unverified", "Idempotency-Key already used",
            "A request with this Idempotency-Key was already made, and the server cannot "
            "tell whether it was yours: it is neither run again nor replayed. "
            "Authenticate, or use a new key.",
        )  # fmt: skip
    elif answer.found is Found.REUSED:
        await send_problem(
            send, 422, "idempotency-key-reused", "Idempotency-Key reused",
            "This Idempotency-Key was already used for a different request.",
        )  # fmt: skip
    elif answer.found is Found.IN_USE:
        await send_problem(
            send, 409, "idempotency-key-in-use", "Request in progress",
            "A request with this Idempotency-Key is still being processed. Retry later.",
            headers=[(b"retry-after", str(max(1, math.ceil(answer.retry_after))).encode())],
        )  # fmt: skip
    else:
        await _replay(answer, send)


async def _replay(answer: Answer, send: Send) -> None:
    """The stored response, or 410 when it was too large to keep."""
    response = answer.response
    assert response is not None
    if response.body is None:
        await send_problem(
            send, 410, "idempotency-response-not-stored", "Response not stored",
            "This request was already processed, but its response was too large to keep; "
            "it will not be run again.",
            headers=[(b"idempotent-replayed", b"true")],
            original_status=response.status,
        )  # fmt: skip
        return
    await send_response(send, response.status, replay_headers(response.headers), response.body)


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
