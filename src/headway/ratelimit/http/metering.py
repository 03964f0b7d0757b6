"""Metered costs over HTTP: a rule reserves an estimate per request and settles the actual
cost once the response ends (``Metering``), from the response or from a ``Meter``.

The guard reserves (``RateLimiter.reserve``) and puts the settle on the request's stack
of things to close (``Ruling.slots``), which the middleware closes when the response's
last body message is sent, when the client disconnects, or when the app returns or
raises; the decorator when the response it returned has been sent; the FastAPI
dependency when FastAPI runs its exit code, after the response. What the settle uses,
first found: ``Metering.actual`` (a header the response carries, in its head or its
trailers, or a function of the status and headers), else the units the handler reported
to the request's ``Meter`` (``Meter.of(request).add(n)`` while it streams), else the
estimate (nothing changes). A request another rule refused settles at 0: it never ran.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.responses import Response

from headway._http import Receive, Scope, Send

if TYPE_CHECKING:
    from headway.ratelimit.decision import Decision
    from headway.ratelimit.limiter import RateLimiter
    from headway.ratelimit.reservation import Reservation

__all__ = [
    "METER",
    "ActualFunction",
    "EstimateFunction",
    "Meter",
    "Metering",
    "Reserving",
    "pending_settles",
    "settled_later",
]

log = logging.getLogger("headway.ratelimit")

#: Where a metered request's ``Meter`` is kept in its scope.
METER = "headway.meter"

EstimateFunction = Callable[[Scope], "int | Awaitable[int]"]
"""A request's estimate: a function of the scope, sync or async."""
ActualFunction = Callable[[int, Headers], "int | None"]
"""A response's actual cost from its status and headers (trailers included), or None
when it does not say (the ``Meter`` then, else the estimate)."""


@dataclass(frozen=True, slots=True)
class Metering:
    """A rule's metered policies: reserve an estimate per request, settle the actual cost.

    Args:
        estimate: Units each metered policy is charged when the request arrives: an int
            (>= 0), or a function of the scope (sync or async) returning one.
        actual: Where the actual cost is read once the response ends: the name of a
            header the handler sets (in the response head or its trailers), or a
            function of the status and headers returning it (or None). Default
            ``"x-tokens-used"``. When it says nothing, the units the handler reported to
            the request's ``Meter`` count; when there are none either, the estimate stays.
        policies: Names of the rule's policies that are metered (as in the headers:
            the keys of a mapping, or ``name``, ``name-1``...); the others count
            requests and are charged 1. Default None: every policy of the rule.
        ttl: Seconds after which a reservation no longer settles (its estimate stays);
            default 600.0.

    Raises:
        TypeError: An option of the wrong type.
        ValueError: A negative estimate, an empty header name, or a bad ``ttl``.
    """

    estimate: int | EstimateFunction
    actual: str | ActualFunction = "x-tokens-used"
    policies: Sequence[str] | None = None
    ttl: float = 600.0

    def __post_init__(self) -> None:
        estimate = self.estimate
        if isinstance(estimate, bool) or not (isinstance(estimate, int) or callable(estimate)):
            raise TypeError(f"Metering.estimate must be an int or a function, got {estimate!r}")
        if isinstance(estimate, int) and estimate < 0:
            raise ValueError(f"Metering.estimate must be >= 0, got {estimate}")
        if isinstance(self.actual, str):
            if not self.actual:
                raise ValueError("Metering.actual: a header name cannot be empty")
        elif not callable(self.actual):
            raise TypeError(f"Metering.actual must be a header name or a function: {self.actual!r}")
        if isinstance(self.policies, str):
            raise TypeError("Metering.policies takes a list of policy names, not one name")
        ttl = self.ttl
        if isinstance(ttl, bool) or not isinstance(ttl, int | float):
            raise TypeError(f"Metering.ttl must be a number of seconds, got {ttl!r}")
        if not math.isfinite(ttl) or ttl <= 0:
            raise ValueError(f"Metering.ttl must be finite and > 0, got {ttl!r}")

    async def estimate_for(self, scope: Scope) -> int:
        """The request's estimate.

        Args:
            scope: The request's ASGI scope.

        Raises:
            TypeError: The estimate function returned something other than an int (a
                bool counts as not an int).
        """
        estimate = self.estimate
        if isinstance(estimate, int):
            return estimate
        value = estimate(scope)
        if not isinstance(value, int):
            value = await value
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"estimate function {estimate!r} returned {value!r}, not an int")
        return value


class Meter:
    """The units one request's response used, as its handler reports them.

    ``Meter.of(request)`` gives the request's (a new one, counting nothing, when no
    metered rule applied: handlers need not know). Call ``add`` as the work goes on,
    e.g. per streamed chunk: a client that leaves mid-stream is charged what was
    reported until then.
    """

    __slots__ = ("_pending", "headers", "refused", "reported", "status", "trailing", "units")

    def __init__(self) -> None:
        #: Units reported so far.
        self.units = 0
        #: Whether ``add`` was called.
        self.reported = False
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.refused = False
        self.trailing = False  # the response sends trailers after its body
        self._pending: list[tuple[RateLimiter, Reservation, Metering]] = []

    @classmethod
    def of(cls, connection: HTTPConnection | Scope) -> Meter:
        """The request's meter (a detached one when no metered rule applied).

        Args:
            connection: The request (Starlette's, FastAPI's), or its ASGI scope.
        """
        scope = connection.scope if isinstance(connection, HTTPConnection) else connection
        meter = scope.get(METER)
        return meter if isinstance(meter, Meter) else cls()

    def add(self, units: int) -> None:
        """Report ``units`` more (>= 0).

        Args:
            units: Units the work used since the last report.

        Raises:
            TypeError: ``units`` is not an int.
            ValueError: ``units`` is negative.
        """
        if isinstance(units, bool) or not isinstance(units, int):
            raise TypeError(f"units must be an int, not {type(units).__name__}")
        if units < 0:
            raise ValueError(f"units must be >= 0, got {units}")
        self.units += units
        self.reported = True

    def response(self, status: int, headers: Sequence[tuple[bytes, bytes]]) -> None:
        """Note the response's status and headers (the guard's callers do).

        Args:
            status: The response's status code.
            headers: Its raw header list (trailers are added with ``trailers``).
        """
        self.status = status
        self.headers = list(headers)

    def trailers(self, headers: Sequence[tuple[bytes, bytes]]) -> None:
        """Note the response's trailers.

        Args:
            headers: The raw trailer list.
        """
        self.headers = [*self.headers, *headers]

    def actual(self, metering: Metering, estimate: int) -> int:
        """The actual cost to settle at, by ``metering``'s rule (see the module docstring).

        Args:
            metering: The rule's ``Metering``.
            estimate: What was reserved.
        """
        if self.refused:
            return 0
        if self.status is not None:
            found = _from_response(metering.actual, self.status, Headers(raw=self.headers))
            if found is not None:
                return found
        return self.units if self.reported else estimate

    def hold(self, limiter: RateLimiter, reservation: Reservation, metering: Metering) -> bool:
        """Keep ``reservation`` to settle; whether it is the first (then register ``settle``).

        Args:
            limiter: The rule's limiter.
            reservation: What it reserved.
            metering: The rule's ``Metering``.
        """
        self._pending.append((limiter, reservation, metering))
        return len(self._pending) == 1

    async def settle(self) -> None:
        """Settle every reservation held (once; a failure is logged, the estimate stays)."""
        pending, self._pending = self._pending, []
        for limiter, reservation, metering in pending:
            try:
                await limiter.settle(reservation, self.actual(metering, reservation.estimate))
            except Exception:  # a bad value from the app's function: the estimate stays
                log.exception("rate limit: could not settle %r", reservation)


class Reserving:
    """A metered rule's reservation for one request, made by the guard: each call reserves
    (a try in a wait line calls it again; a refused try charges nothing); ``settles``
    then gives the request meter's ``settle`` if the admitted reservation is the first it
    holds (the guard puts it on the request's stack)."""

    def __init__(
        self, scope: Scope, metering: Metering, limiter: RateLimiter, key: str, estimate: int
    ) -> None:
        self.scope, self.metering, self.limiter = scope, metering, limiter
        self.key, self.estimate = key, estimate
        self.reservation: Reservation | None = None

    async def __call__(self) -> Decision:
        reserved = await self.limiter.reserve(self.key, self.estimate, ttl=self.metering.ttl)
        self.reservation = reserved
        return reserved.decision

    def settles(self) -> Callable[[], Awaitable[None]] | None:
        """The meter's ``settle`` to register, or None (nothing charged, or not the first)."""
        reservation = self.reservation
        if reservation is None or not (reservation.allowed and reservation.at_us is not None):
            return None  # nothing charged: nothing to settle
        meter = self.scope.get(METER)
        if not isinstance(meter, Meter):
            meter = self.scope[METER] = Meter()
        first = meter.hold(self.limiter, reservation, self.metering)
        return meter.settle if first else None


def settled_later(
    slots: contextlib.AsyncExitStack | None, scope: Scope, result: object, sub_response: object
) -> bool:
    """For the decorator: note a metered request's response; whether ``slots`` (its
    settles) must wait for it to be sent (else the caller closes them now).

    A returned ``Response`` (streamed or not) settles once it has been sent, or its client
    has left (``_close_after``), with its status and headers; a value FastAPI serializes
    settles now, with the sub-response's.
    """
    meter = pending_settles(scope)
    if meter is None or slots is None:
        return False
    if isinstance(result, Response):
        meter.response(result.status_code, result.raw_headers)
        _close_after(result, slots)
        return True
    if isinstance(sub_response, Response):
        meter.response(sub_response.status_code or 200, sub_response.raw_headers)
    else:
        meter.response(200, [])
    return False


#: Per response class, its subclass that closes the request's stack once it is sent.
_CLOSING: dict[type[Response], type[Response]] = {}


def _close_after(response: Response, stack: contextlib.AsyncExitStack) -> None:
    """Make ``response`` close ``stack`` after it is sent (its class swapped for a subclass
    of the same layout: the framework sends what the handler returned)."""
    cls = type(response)
    closing = _CLOSING.get(cls)
    if closing is None:

        async def send_then_close(
            self: Response, scope: Scope, receive: Receive, send: Send
        ) -> None:
            try:
                await cls.__call__(self, scope, receive, send)
            finally:
                await self.__dict__.pop("_headway_close")()

        namespace = {"__call__": send_then_close, "__module__": cls.__module__}
        closing = _CLOSING[cls] = type(cls.__name__, (cls,), namespace)
    response.__dict__["_headway_close"] = stack.aclose
    response.__class__ = closing


def _from_response(actual: str | ActualFunction, status: int, headers: Headers) -> int | None:
    if callable(actual):
        return actual(status, headers)
    value = headers.get(actual)
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        log.warning("rate limit: header %s=%r is not an integer: the estimate stays", actual, value)
        return None


def pending_settles(scope: Scope) -> Meter | None:
    """The request's meter if it holds reservations to settle."""
    meter: Any = scope.get(METER)
    return meter if isinstance(meter, Meter) and meter._pending else None
