"""A toy record store: a dict behind ``RecordBackend``, for one process.

Written from the docstrings of ``headway.RecordBackend`` and its values (and "Add an
idempotency store" in ``docs/extending.md``) alone, importing only from ``headway``: no
SQL, no ``RecordStore``. It joins the shared
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

from headway import Claim, ClaimOutcome, Record, RecordStatus, StoredResponse

__all__ = ["ToyRecordStore"]


@dataclass
class _Row:
    fingerprint: str
    status: RecordStatus
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

    def _live(self, caller: str, key: str, now: float) -> _Row | None:
        row = self._rows.get((caller, key))
        if row is not None and now >= row.expires:  # its ttl ran out: as if never written
            del self._rows[caller, key]
            return None
        return row

    def _ours(self, caller: str, key: str, fence: int) -> _Row | None:
        """Our record: live, PROCESSING, under ``fence`` (every fenced write's check)."""
        row = self._live(caller, key, self.clock())
        if row is None or row.status is not RecordStatus.PROCESSING or row.fence != fence:
            return None
        return row

    async def get(self, caller: str, key: str) -> Record | None:
        await asyncio.sleep(0)
        row = self._live(caller, key, self.clock())
        return None if row is None else _record(caller, key, row)

    async def claim(
        self, caller: str, key: str, fingerprint: str, *, lease_token: str, lease_ttl: float
    ) -> Claim:
        await asyncio.sleep(0)
        now = self.clock()
        row = self._live(caller, key, now)
        if row is None:  # a fence no earlier claim may hold: random, from a large range
            fence = secrets.randbelow(1 << 40) + 1
            self._rows[caller, key] = _Row(
                fingerprint, RecordStatus.PROCESSING, fence, now + lease_ttl, now + self.ttl
            )
            return Claim(ClaimOutcome.CLAIMED, fence=fence)
        if row.fingerprint != fingerprint:
            return Claim(ClaimOutcome.MISMATCH, _record(caller, key, row))
        if row.status is RecordStatus.COMPLETED:
            return Claim(ClaimOutcome.COMPLETED, _record(caller, key, row))
        if row.lease_ends > now:
            return Claim(
                ClaimOutcome.BUSY, _record(caller, key, row), lease_left=row.lease_ends - now
            )
        # A lapsed lease: taken over in place, under the next fence (lease_token unused:
        # one atomic step needs no token to tell whose write won).
        row.fence, row.lease_ends, row.expires = row.fence + 1, now + lease_ttl, now + self.ttl
        return Claim(ClaimOutcome.CLAIMED, fence=row.fence)

    async def renew(self, caller: str, key: str, fence: int, lease_ttl: float) -> bool:
        await asyncio.sleep(0)
        row = self._ours(caller, key, fence)
        if row is None:
            return False
        row.lease_ends = self.clock() + lease_ttl
        return True

    async def complete(self, caller: str, key: str, fence: int, response: StoredResponse) -> bool:
        await asyncio.sleep(0)
        row = self._ours(caller, key, fence)
        if row is None:
            return False
        row.status, row.response = RecordStatus.COMPLETED, response
        row.expires = self.clock() + self.ttl
        return True

    async def release(self, caller: str, key: str, fence: int) -> bool:
        await asyncio.sleep(0)
        if self._ours(caller, key, fence) is None:
            return False
        del self._rows[caller, key]
        return True


def _record(caller: str, key: str, row: _Row) -> Record:
    return Record(caller, key, row.fingerprint, row.status, row.fence, row.response)
