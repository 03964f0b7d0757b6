"""What an idempotency record store implements: ``RecordBackend``.

The idempotency engine (``engine``: both faces, ``IdempotencyMiddleware`` and
``idempotent_function``) keeps one record per (caller, key) and touches it only through
these five calls. ``RecordStore`` (SQL) is the built-in one; a store of your own (a
document store, a key-value store with compare-and-set) implements the same five and
is passed as ``store=``. See "Add an idempotency store" in ``docs/extending.md``.

The values it takes and returns are plain values exported from ``headway`` (defined in
``headway.idempotency.record``): ``Record``, ``RecordStatus``, ``Claim``,
``ClaimOutcome``, ``StoredResponse``.

**The caller** is whom a record belongs to: for HTTP, the id ``scope_function``'s name
hashes to (or the unnamed callers' partition); for a function, an id derived from its
``namespace``. Records of two callers never meet, even under one key.

**Time** is the store's: a record is kept ``ttl`` s (the store's own setting, not an
argument) and a record's lease lasts ``lease_ttl`` s, both counted on one clock every
process writing to the store shares (``RecordStore`` uses the database's). A record whose
``ttl`` ran out is never returned, and the next claim replaces it.

**The fence** is the store's: it picks the record's fencing token when a claim takes the
record: on a fresh insert, a token no earlier claim of this key may still hold
(``RecordStore`` draws one at random below 2**40; a counter that never restarts would do);
on a takeover, the old token + 1. Every later write names
that fence, and is refused (False) unless the record is still PROCESSING under it: so a
worker whose record was taken over (it paused past its lease) cannot renew, complete or
release the new worker's record. The engine never chooses a fence.

**Atomic**: ``claim`` decides and writes in one step against concurrent claims of the
same (caller, key) from every process (of N concurrent claims at most one gets
``CLAIMED``); each fenced write is one compare-and-set. **Failure**: raise
``BackendUnavailable(..., backend="database")`` when the store cannot answer (bound every
call by a timeout of your own); the middleware answers 503, nothing is recorded.
"""

from __future__ import annotations

from typing import Protocol

from headway.idempotency.record import Claim, Record, StoredResponse

__all__ = ["RecordBackend"]


class RecordBackend(Protocol):
    """Where idempotency records live: read, claim, renew, complete and release one record.

    A record (``Record``) is (caller, key) with the request's ``fingerprint``, a
    ``status`` (``RecordStatus.PROCESSING`` while a worker runs it, ``COMPLETED`` once
    its response is stored), its ``fence`` and, once completed, its ``response``. A
    PROCESSING record also carries a lease (the claim's ``lease_token``, an end time on
    the store's clock) that its worker renews.
    """

    async def get(self, caller: str, key: str) -> Record | None:
        """The live record of (caller, key), or None (none, or its ``ttl`` ran out).

        PROCESSING records are returned too (``response`` None), whether their lease
        lives or not. A COMPLETED record's ``response`` is what ``complete`` stored,
        its ``body`` None when that was stored without one.

        Args:
            caller: Whose record: the HTTP caller's id or the function's namespace id.
            key: The idempotency key.

        Raises:
            BackendUnavailable: The store cannot answer (``backend="database"``).
        """
        ...

    async def claim(
        self, caller: str, key: str, fingerprint: str, *, lease_token: str, lease_ttl: float
    ) -> Claim:
        """Take the record of (caller, key) for this request, or say why not; atomic.

        - No live record: insert it, PROCESSING, with ``fingerprint``, a fence the store
          picks (see the module: never one an earlier claim of this key may hold),
          ``lease_token`` and a lease ending ``lease_ttl`` s from now, kept the store's
          ``ttl``: ``Claim(CLAIMED, fence=that fence)``.
        - A record with another fingerprint: ``Claim(MISMATCH, record)``, whatever its
          status.
        - COMPLETED, same fingerprint: ``Claim(COMPLETED, record)`` (to replay).
        - PROCESSING, same fingerprint, its lease over (the worker died or stalled): take
          it over in place, fence = the old fence + 1, the new ``lease_token`` and lease,
          kept the store's ``ttl`` from now: ``Claim(CLAIMED, fence=old + 1)``.
        - PROCESSING, same fingerprint, its lease alive: ``Claim(BUSY, record,
          lease_left=s)``, ``s`` the seconds until that lease ends at the latest (None if
          unknown: the engine then says ``lease_ttl``).

        The decision and the write are one step: of concurrent claims of one (caller,
        key), in any number of processes, at most one is CLAIMED.

        Args:
            caller: Whose record: the HTTP caller's id or the function's namespace id.
            key: The idempotency key.
            fingerprint: What the request (or call) is, to tell a retry from a reuse.
            lease_token: The claiming worker's lease token (random, its own).
            lease_ttl: The record's lease in seconds from now, on the store's clock.

        Raises:
            BackendUnavailable: The store cannot answer (``backend="database"``).
        """
        ...

    async def renew(self, caller: str, key: str, fence: int, lease_ttl: float) -> bool:
        """Move our record's lease end to ``lease_ttl`` s from now; whether it was ours.

        Only if the record is PROCESSING with ``fence`` (one compare-and-set); False,
        writing nothing, if it was taken over, released or completed. The engine
        renews every third of ``lease_ttl`` and stops the work on False.

        Args:
            caller: Whose record: the HTTP caller's id or the function's namespace id.
            key: The idempotency key.
            fence: The fence our claim got.
            lease_ttl: The new lease in seconds from now, on the store's clock.

        Raises:
            BackendUnavailable: The store cannot answer (``backend="database"``).
        """
        ...

    async def complete(self, caller: str, key: str, fence: int, response: StoredResponse) -> bool:
        """Store ``response`` and mark our record COMPLETED; whether it was ours.

        Only if the record is PROCESSING with ``fence`` (one compare-and-set): then the
        record keeps ``response`` (status, headers, and ``body``, which may be None), has
        no lease any more, and is kept the store's ``ttl`` from now. False, writing
        nothing, otherwise: the outcome must not count (a newer worker owns the key).

        Args:
            caller: Whose record: the HTTP caller's id or the function's namespace id.
            key: The idempotency key.
            fence: The fence our claim got.
            response: The outcome to keep (status, headers, body).

        Raises:
            BackendUnavailable: The store cannot answer (``backend="database"``).
        """
        ...

    async def release(self, caller: str, key: str, fence: int) -> bool:
        """Delete our record so a retry runs again; whether it was ours.

        Only if the record is PROCESSING with ``fence`` (one compare-and-set); a
        COMPLETED record, or one another worker took over, is left as it is (False).

        Args:
            caller: Whose record: the HTTP caller's id or the function's namespace id.
            key: The idempotency key.
            fence: The fence our claim got.

        Raises:
            BackendUnavailable: The store cannot answer (``backend="database"``).
        """
        ...
