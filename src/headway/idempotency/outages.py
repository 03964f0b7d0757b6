"""What a database error means to a record store's caller: "cannot answer now"
(``BackendUnavailable``), "never migrated" (``DatabaseNotMigrated``, logged at most every
``REPORT_EVERY`` seconds), or a mistake that propagates as it is."""

from __future__ import annotations

import logging
import math
import time

from sqlalchemy import URL
from sqlalchemy import exc as sa_exc

from headway._database import shown, table_missing
from headway._errors import BackendUnavailable, DatabaseNotMigrated
from headway.idempotency.table import records

__all__ = ["REPORT_EVERY", "UNAVAILABLE", "Outages"]

log = logging.getLogger("headway.idempotency")

#: Seconds between two log lines about a missing table (the first is logged at once).
REPORT_EVERY = 300.0

#: Database errors that mean "cannot answer now" rather than "you asked wrongly".
UNAVAILABLE: tuple[type[BaseException], ...] = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.TimeoutError,  # pool checkout
    OSError,
    TimeoutError,
)


class Outages:
    """Maps one store's database errors (the database at ``url``) to what callers see."""

    __slots__ = ("_reported", "url")

    def __init__(self, url: str | URL) -> None:
        self.url = url
        self._reported = -math.inf  # when a missing table was last logged (monotonic clock)

    def unavailable(self, exc: Exception) -> BackendUnavailable | None:
        """What ``exc`` means for the caller, when it means "cannot answer now"."""
        if table_missing(exc, records.name):
            return self.not_migrated()
        if isinstance(exc, UNAVAILABLE):
            return BackendUnavailable(f"database unavailable: {exc}", backend="database")
        if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
            return BackendUnavailable(f"database connection lost: {exc}", backend="database")
        return None

    def not_migrated(self) -> DatabaseNotMigrated:
        """The error for a missing table, logged once every ``REPORT_EVERY`` seconds: every
        keyed request fails until someone migrates, and one line says what to do."""
        advice = f"run `headway migrate {shown(self.url)}`"
        message = f"the idempotency table {records.name} does not exist: {advice}"
        now = time.monotonic()
        if now - self._reported >= REPORT_EVERY:
            self._reported = now
            log.error("%s (until then, every keyed request is answered 503)", message)
        return DatabaseNotMigrated(message, backend="database")
