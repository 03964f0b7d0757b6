"""The one idempotency engine under both faces, ``IdempotencyMiddleware`` and
``idempotent_function``: read the record; answer from it, or claim it (the lock requested
alongside) and run the face's work under both leases; then the fenced completion or the
release. The faces render what it returns: ``middleware`` and ``answers`` as HTTP
responses, ``function`` as a return value or an exception.

One fencing rule: the record's fence is the database's (random below 2**40 on insert,
the old one + 1 on a takeover), whether the lock was taken or not; docs/decisions/idempotency.md
says why.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from headway._errors import BackendUnavailable, LockLost, LockNotAcquired, LockNotOwned
from headway.idempotency.contract import RecordBackend
from headway.idempotency.events import IdempotencyEventKind, IdempotencyHook
from headway.idempotency.hooks import emit
from headway.idempotency.record import Claim, ClaimOutcome, Record, RecordStatus, StoredResponse
from headway.idempotency.renewal import RequestLeases
from headway.lock.contract import LockBackend
from headway.lock.driver import run_to_end
from headway.lock.lease import Lease, check_timeout, check_ttl, new_token
from headway.lock.lock import Lock

__all__ = ["Answer", "Call", "Engine", "Found", "Work"]

log = logging.getLogger("headway.idempotency")


class Call:
    """One call with a key: the request of the HTTP face, the call of the function face."""

    __slots__ = ("caller", "earlier", "fingerprint", "key", "label", "named")

    def __init__(
        self,
        caller: str,
        key: str,
        fingerprint: str,
        *,
        label: str | None = None,
        named: bool = True,
        earlier: Callable[[], str] | None = None,
    ) -> None:
        self.caller = caller  # the record's ``scope`` column: ``callers.Caller.id``, a function's
        self.key = key
        self.fingerprint = fingerprint
        self.label = caller if label is None else label  # the events' ``caller``
        self.named = named  # False: the UNVERIFIED partition, where nothing is replayed
        # The fingerprint an earlier release stored for this request, computed only if
        # a record does not match ``fingerprint`` (``fingerprints.earlier_fingerprint``).
        self.earlier = earlier

    @property
    def resource(self) -> str:
        """The lock resource (and what a lost lease names)."""
        return f"idempotency/{self.caller}/{self.key}"

    def matches(self, stored: str) -> bool:
        """Whether a record's fingerprint is this call's (now, or as stored before)."""
        return stored == self.fingerprint or (self.earlier is not None and stored == self.earlier())


class Found(enum.Enum):
    """Why the work did not run."""

    REPLAY = "replay"  # completed with this fingerprint: ``Answer.response`` is what it stored
    REUSED = "reused"  # the key was used with a different fingerprint
    UNVERIFIED = "unverified"  # an unnamed caller's key already used: neither run nor replayed
    IN_USE = "in_use"  # in flight elsewhere; its lease ends within ``Answer.retry_after`` s


@dataclass(frozen=True, slots=True)
class Answer:
    """What the engine found instead of running the work; the face renders it."""

    found: Found
    response: StoredResponse | None = None
    retry_after: float = 0.0


class Work(Protocol):
    """What a face runs once its call has claimed the record."""

    async def run(self) -> StoredResponse | None:
        """Do the work; what to store, or None to release the record (a retry runs again).
        An exception releases the record and propagates."""

    async def finish(self) -> None:
        """Called once the record is settled (completed or released), under the leases."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Engine:
    """Claim, run, and complete or release one key's record, for one face's options
    (``lease_ttl`` and ``wait`` in seconds, checked as the lock checks them)."""

    store: RecordBackend
    lock_backend: LockBackend
    lease_ttl: float
    wait: float
    source: Literal["http", "function"]
    on_event: IdempotencyHook | None = None
    database_fallback: bool = False

    def __post_init__(self) -> None:
        check_ttl(self.lease_ttl)
        check_timeout(self.wait)

    async def execute(self, call: Call, work: Work) -> Answer | None:
        """Answer from the record, or claim it and run ``work`` once (then None)."""
        record = await self.store.get(call.caller, call.key)
        if record is not None and (answer := await self._answer(call, record)) is not None:
            return answer
        lock = Lock(self.lock_backend, call.resource, ttl=self.lease_ttl, timeout=self.wait)
        acquiring = asyncio.ensure_future(lock.acquire())
        try:
            claim, lease, sent = await self._claim(call, acquiring)
        except LockNotAcquired:  # waited in vain, or the holder finished meanwhile
            return await self._settled(call, await self.store.get(call.caller, call.key), None)
        except BaseException:
            await _abandon(acquiring, lock)
            raise
        try:
            if claim.outcome is not ClaimOutcome.CLAIMED:
                return await self._settled(call, claim.record, claim.lease_left)
            assert claim.fence is not None
            held = None if lease is None else (lock, lease)
            await self._run_claimed(call, claim.fence, sent, held, work)
            return None
        finally:
            if lease is not None:
                await _release_lock(lock, lease)

    async def _claim(
        self, call: Call, acquiring: asyncio.Future[Lease]
    ) -> tuple[Claim, Lease | None, float]:
        """Claim the record beside the lock being taken: the claim, the lock's lease (None
        when running without it) and when the claim was sent (monotonic clock).

        Without ``wait`` the lock's request overlaps the claim's: the record's primary key
        and fence decide who runs, so neither round trip waits for the other. With it,
        the lock comes first: it is what a duplicate waits on.
        """
        lease: Lease | None = None
        if self.wait > 0:
            lease = await self._locked(acquiring, call, None)
        sent = time.monotonic()
        claim = await self.store.claim(
            call.caller, call.key, call.fingerprint,
            lease_token=new_token(), lease_ttl=self.lease_ttl,
        )  # fmt: skip
        if self.wait == 0:
            lease = await self._locked(acquiring, call, claim)
        return claim, lease, sent

    async def _run_claimed(
        self, call: Call, fence: int, sent: float, held: tuple[Lock, Lease] | None, work: Work
    ) -> None:
        """Run ``work`` on the record claimed under ``fence`` at ``sent``, its lease (and
        the lock's, ``held``) renewed meanwhile."""
        await self._emit("claimed", call, fence)
        # The record's lease counted from when the claim was sent: never later than the
        # database's.
        leased = Lease(call.resource, "", fence, sent + self.lease_ttl, self.lease_ttl)
        leases = RequestLeases(self.store, call.caller, call.key, leased, held)
        started = False
        try:
            async with leases.watchdog(self.lease_ttl):
                started = True
                await self._run(call, fence, work)
        except BaseException:
            if not started:  # a nearly spent lease could not be renewed: nothing ran
                await self._release_record(call, fence, quietly=True)
            raise

    async def _locked(
        self, acquiring: asyncio.Future[Lease], call: Call, claim: Claim | None
    ) -> Lease | None:
        """The lock lease, once taken; None when running without it.

        After a ``claim`` (no ``wait``), a lock held elsewhere gives None: a record this
        call claimed runs under its own lease (the peer holding the lock found the
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
            if claim is not None and claim.fence is not None:
                # ``released`` with no ``claimed`` before it: the work never started.
                await self._release_record(call, claim.fence, quietly=False)
            raise

    async def _run(self, call: Call, fence: int, work: Work) -> None:
        """Run the work on our claimed record; store its outcome (fenced) or release it."""
        try:
            stored = await work.run()
        except BaseException:
            await self._release_record(call, fence, quietly=True)
            raise
        if stored is None:
            await self._release_record(call, fence, quietly=False)
        elif await self.store.complete(call.caller, call.key, fence, stored):
            await self._emit("completed", call, fence)
        else:  # a newer claim took the record over: this outcome must not count
            message = f"fence {fence} was superseded; the outcome was not stored"
            raise LockLost(message, resource=call.resource)
        await work.finish()

    async def _release_record(self, call: Call, fence: int, *, quietly: bool) -> None:
        """Delete our record so a retry runs again. ``quietly``: the work's own error
        matters more than the release's, which is logged (the record's lease runs out)."""
        try:
            released = await run_to_end(self.store.release(call.caller, call.key, fence))
        except Exception as exc:
            if not quietly:
                raise
            log.warning("could not release an idempotency record: %s", exc)
            return
        if released:
            await self._emit("released", call, fence)

    async def _answer(self, call: Call, record: Record) -> Answer | None:
        """The answer an existing record gives; None if it is still in flight."""
        if not call.named:  # any record may be another caller's: tell nothing of it
            await self._emit("conflict", call)
            return Answer(Found.UNVERIFIED)
        if not call.matches(record.fingerprint):
            await self._emit("key_reused", call)
            return Answer(Found.REUSED)
        if record.status is not RecordStatus.COMPLETED or record.response is None:
            return None
        await self._emit("replayed", call, record.fence)
        return Answer(Found.REPLAY, record.response)

    async def _settled(self, call: Call, record: Record | None, left: float | None) -> Answer:
        """The answer when the record was not ours to claim: from ``record`` if it says
        one, else in use (its lease ends within ``left`` s, by default ``lease_ttl``)."""
        if record is not None and (answer := await self._answer(call, record)) is not None:
            return answer
        await self._emit("conflict", call)
        return Answer(Found.IN_USE, retry_after=self.lease_ttl if left is None else left)

    async def _emit(self, kind: IdempotencyEventKind, call: Call, fence: int | None = None) -> None:
        await emit(self.on_event, kind, self.source, call.label, call.key, fence)


async def _abandon(acquiring: asyncio.Future[Lease], lock: Lock) -> None:
    """Give up the lock being taken (the claim failed): cancel it, or release what it took."""
    if not acquiring.done():
        acquiring.cancel()  # what it may still take lapses by its TTL
        return
    if not acquiring.cancelled() and acquiring.exception() is None:
        await _release_lock(lock, acquiring.result())


async def _release_lock(lock: Lock, lease: Lease) -> None:
    """Release the call's lock; a lapsed or unreachable lock expires by its TTL."""
    try:
        await lock.release(lease)  # shielded from cancellation by the lock
    except (LockNotOwned, BackendUnavailable) as exc:
        # The record settled under its own fenced writes: the lock's end changes nothing.
        log.warning("releasing %r failed; it expires by its TTL: %s", lease.resource, exc)
