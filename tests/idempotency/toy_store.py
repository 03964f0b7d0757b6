"""A toy record store: a dict behind ``RecordBackend``, for one process.

Written from the docstrings of ``headway.idempotency.contract`` (and "Add an idempotency
store" in ``docs/extending.md``) alone: no SQL, no ``RecordStore``. It joins the shared
suite (``record_backend`` in ``conftest.py``), which shows that a store written against
the contract alone can carry both faces.

Each call awaits one loop turn (the request), then acts without awaiting: every call is
one atomic step, as the contract asks, on one event loop.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from headway.idempotency.record import Claim, ClaimOutcome, Record, StoredResponse
from headway.idempotency.table import Status

__all__ = ["ToyRecordStore"]


@dataclass
class _Row:
    fingerprint: str
    status: Status
    fence: int
    lease_ends: float  # on ``clock``; meaningless once COMPLETED
    expires: float
    response: StoredResponse | None = None


class ToyRecordStore:
    """Records in a dict, kept ``ttl`` s on ``clock`` (one process: its monotonic clock)."""

    def __init__(self, *, ttl: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.clock = clock
        self._rows: dict[tuple[str, str], _Row] = {}

    def _live(self, scope: str, key: str, now: float) -> _Row | None:
        row = self._rows.get((scope, key))
        if row is not None and now >= row.expires:  # its ttl ran out: as if never written
            del self._rows[scope, key]
            return None
        return row

    def _ours(self, scope: str, key: str, fence: int) -> _Row | None:
        """Our record: live, PROCESSING, under ``fence`` (every fenced write's check)."""
        row = self._live(scope, key, self.clock())
        if row is None or row.status is not Status.PROCESSING or row.fence != fence:
            return None
        return row

    async def get(self, scope: str, key: str) -> Record | None:
        await asyncio.sleep(0)
        row = self._live(scope, key, self.clock())
        return None if row is None else _record(scope, key, row)

    async def claim(
        self, scope: str, key: str, fingerprint: str, *, lease_token: str, lease_ttl: float
    ) -> Claim:
        await asyncio.sleep(0)
        now = self.clock()
        row = self._live(scope, key, now)
        if row is None:  # a fence no earlier claim may hold: random, from a large range
            fence = secrets.randbelow(1 << 40) + 1
            self._rows[scope, key] = _Row(
                fingerprint, Status.PROCESSING, fence, now + lease_ttl, now + self.ttl
            )
            return Claim(ClaimOutcome.CLAIMED, fence=fence)
        if row.fingerprint != fingerprint:
            return Claim(ClaimOutcome.MISMATCH, _record(scope, key, row))
        if row.status is Status.COMPLETED:
            return Claim(ClaimOutcome.COMPLETED, _record(scope, key, row))
        if row.lease_ends > now:
            return Claim(
                ClaimOutcome.BUSY, _record(scope, key, row), lease_left=row.lease_ends - now
            )
        # A lapsed lease: taken over in place, under the next fence (lease_token unused:
        # one atomic step needs no token to tell whose write won).
        row.fence, row.lease_ends, row.expires = row.fence + 1, now + lease_ttl, now + self.ttl
        return Claim(ClaimOutcome.CLAIMED, fence=row.fence)

    async def renew(self, scope: str, key: str, fence: int, lease_ttl: float) -> bool:
        await asyncio.sleep(0)
        row = self._ours(scope, key, fence)
        if row is None:
            return False
        row.lease_ends = self.clock() + lease_ttl
        return True

    async def complete(self, scope: str, key: str, fence: int, response: StoredResponse) -> bool:
        await asyncio.sleep(0)
        row = self._ours(scope, key, fence)
        if row is None:
            return False
        row.status, row.response, row.expires = Status.COMPLETED, response, self.clock() + self.ttl
        return True

    async def release(self, scope: str, key: str, fence: int) -> bool:
        await asyncio.sleep(0)
        if self._ours(scope, key, fence) is None:
            return False
        del self._rows[scope, key]
        return True


def _record(scope: str, key: str, row: _Row) -> Record:
    return Record(scope, key, row.fingerprint, row.status, row.fence, row.response)
