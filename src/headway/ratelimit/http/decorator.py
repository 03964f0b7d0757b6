"""``rate_limit``: the middleware's checks for one endpoint (Starlette and FastAPI).

The handler keeps its signature (``ParamSpec``) and need not take a
``request``: the wrapper finds it among the arguments (Starlette passes it),
or asks FastAPI for it through keyword-only parameters it adds to the
*advertised* signature (``handler_arguments.py``), and removes them before
calling the handler. FastAPI validates the request before calling the handler,
so an invalid request gets its 422 without being charged; the middleware, in
contrast, limits before parsing.

``async def`` handlers are awaited. ``def`` handlers stay synchronous, so
the frameworks still run them in their thread pool; there the wrapper runs
the limiter on the event loop with ``anyio.from_thread.run``. A concurrency
slot is held while the handler runs and released when it returns or raises
(the response it returns is then sent without the slot).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import re
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Literal, ParamSpec, TypeVar, overload

import anyio.from_thread
from starlette.responses import Response

from headway._errors import LockLost
from headway.ratelimit.backends.contract import RateLimitBackend
from headway.ratelimit.http.guard import Guard, Ruling
from headway.ratelimit.http.handler_arguments import advertised, connection
from headway.ratelimit.http.headers import Refusal, slot_lost
from headway.ratelimit.http.identity import Identity
from headway.ratelimit.http.metering import Metering, settled_later
from headway.ratelimit.http.refusals import RefusalHook
from headway.ratelimit.http.reporting import DecisionHook
from headway.ratelimit.http.routes import routed_template
from headway.ratelimit.http.rules import (
    CostFunction,
    Limit,
    LimiterSettings,
    Per,
    PolicyFunction,
    Rule,
    given_policies,
)
from headway.ratelimit.http.watch import decide_watching
from headway.ratelimit.leasing import Leasing
from headway.ratelimit.waiting import DEFAULT_MAX_WAITING, check_waiting

__all__ = ["RateLimitDecorator", "rate_limit"]

P = ParamSpec("P")
R = TypeVar("R")

_IDENTIFIER = re.compile(r"[A-Za-z0-9_]{1,64}")


def _refusal_response(refusal: Refusal | Response) -> Response:
    if isinstance(refusal, Response):  # the on_refusal hook's own
        return refusal
    status, headers, body = refusal
    response = Response(body, status_code=status)
    response.raw_headers.extend(headers)
    return response


def _client_gone() -> Response:
    """The answer to a request whose client left while it waited: nobody reads it, but
    the server logs a status (nginx's 499, "client closed request")."""
    return Response(status_code=499)


def _with_fields(ruling: Ruling, result: Any, sub_response: Any) -> Any:
    """``result`` with the RateLimit fields: on it if it is a response, else on FastAPI's."""
    if isinstance(result, Response):
        result.raw_headers.extend(ruling.headers)
    elif isinstance(sub_response, Response):
        sub_response.raw_headers.extend(ruling.headers)
    return result


class RateLimitDecorator:
    """Applies one rule to each endpoint it decorates; ``rate_limit`` builds it.

    Args:
        rule: The rule each endpoint gets (renamed after the endpoint unless ``named``).
        named: Whether ``rate_limit`` was given a ``name``: the quota is then shared
            by every endpoint of that name, else each endpoint has its own.
        make_guard: Builds an endpoint's guard from its rule (with ``rate_limit``'s
            options).
    """

    def __init__(self, rule: Rule, named: bool, make_guard: Callable[[list[Rule]], Guard]) -> None:
        self.rule = rule
        self.named = named
        #: Builds an endpoint's guard from its rule (with ``rate_limit``'s options).
        self.make_guard = make_guard

    def _guard(self, func: Callable[..., Any]) -> Guard:
        rule = self.rule
        if not self.named:
            name = func.__name__ if _IDENTIFIER.fullmatch(func.__name__) else "endpoint"
            rule = dataclasses.replace(rule, name=name)
        guard = self.make_guard([rule])
        if not self.named:
            # Two modules' ``get_user`` must not share a quota: key on where the handler lives.
            where = f"{func.__module__}.{func.__qualname__}"
            digest = hashlib.blake2b(where.encode(), digest_size=4).hexdigest()
            guard.rules[0].prefix = f"{rule.name}~{digest}"
        return guard

    @overload
    def __call__(
        self, func: Callable[P, Coroutine[Any, Any, R]]
    ) -> Callable[P, Coroutine[Any, Any, R | Response]]: ...

    @overload
    def __call__(self, func: Callable[P, R]) -> Callable[P, R | Response]: ...

    def __call__(self, func: Callable[P, Any]) -> Callable[P, Any]:
        guard = self._guard(func)
        if inspect.iscoroutinefunction(func):
            wrapper = _async_wrapper(func, guard)
        else:
            wrapper = _sync_wrapper(func, guard)
        wrapper.__signature__ = advertised(func)  # type: ignore[attr-defined]
        wrapper.guard = guard  # type: ignore[attr-defined]
        return wrapper


def _async_wrapper(func: Callable[P, Any], guard: Guard) -> Callable[P, Any]:
    """The wrapper of an ``async def`` handler: rules and handler on the event loop."""

    @functools.wraps(func)
    async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
        request, sub_response = connection(args, kwargs)
        scope = request.scope
        if guard.lines is None:
            ruling = await guard.decide(scope, scope.get("method", "GET"))
        elif (watched := await decide_watching(guard, request)) is None:
            return _client_gone()
        else:
            ruling = watched
        later = False  # closed once the response is sent (a metered one)
        try:
            try:
                if ruling.refusal is not None:
                    return _refusal_response(ruling.refusal)
                result = _with_fields(ruling, await func(*args, **kwargs), sub_response)
                later = settled_later(ruling.slots, scope, result, sub_response)
                return result
            finally:
                if ruling.slots is not None and not later:
                    await ruling.slots.aclose()
        except LockLost:  # its slot ended: the handler was stopped (see ``hold()``)
            return _refusal_response(slot_lost())

    return async_wrapper


def _sync_wrapper(func: Callable[P, Any], guard: Guard) -> Callable[P, Any]:
    """The wrapper of a ``def`` handler: it stays in the thread pool, the rules run on the
    event loop (``anyio.from_thread.run``)."""

    @functools.wraps(func)
    def sync_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
        request, sub_response = connection(args, kwargs)
        scope = request.scope
        if guard.lines is None:
            ruling = anyio.from_thread.run(guard.decide, scope, scope.get("method", "GET"))
        elif (watched := anyio.from_thread.run(decide_watching, guard, request)) is None:
            return _client_gone()
        else:
            ruling = watched
        later = False
        try:
            try:
                if ruling.refusal is not None:
                    return _refusal_response(ruling.refusal)
                result = _with_fields(ruling, func(*args, **kwargs), sub_response)
                later = settled_later(ruling.slots, scope, result, sub_response)
                return result
            finally:
                # Else nothing to free: no trip to the loop.
                if ruling.slots is not None and not later:
                    anyio.from_thread.run(ruling.slots.aclose)
        except LockLost:  # its slot ended while the handler ran: it is not counted
            return _refusal_response(slot_lost())

    return sync_wrapper


def rate_limit(
    *policies: Limit | PolicyFunction,
    named: Mapping[str, Limit] | None = None,
    name: str | None = None,
    identity: Identity | Sequence[Identity] | None = None,
    cost: int | CostFunction = 1,
    per: Per = "rule",
    fail: Literal["open", "closed"] | None = None,
    shadow: bool = False,
    backend: RateLimitBackend | None = None,
    on_decision: DecisionHook | None = None,
    legacy_headers: bool = False,
    limiter: LimiterSettings | None = None,
    on_refusal: RefusalHook | None = None,
    lease: Leasing | None = None,
    max_wait: float = 0.0,
    max_waiting: int = DEFAULT_MAX_WAITING,
    metering: Metering | None = None,
) -> RateLimitDecorator:
    """Rate-limit one endpoint with ``policies`` (or ``named`` policies), like a middleware rule.

    Options mean what they mean on ``Rule`` and ``RateLimitMiddleware``. The
    quota is the endpoint's own: ``name`` (default: the function's name) names
    it in the headers; give two endpoints the same ``name`` and ``backend`` to
    share one quota. A refusal is returned as the response (429 or 503,
    problem+json, or what ``on_refusal`` makes of it: see ``RefusalContext``);
    otherwise the handler runs and its response carries the RateLimit header fields.

    Args:
        *policies: The policies: one or several (checked together), a ``Concurrency``
            limit among them, or one function of the request returning them (tiers,
            see ``Rule.policies``).
        named: The policies as a mapping naming each one in the headers, instead of
            ``policies``; default None.
        name: Names the quota in the keys and headers (1-64 letters, digits, ``_``,
            ``.`` or ``-``); default None: the function's name, made unique per
            endpoint by a digest of its module and qualified name.
        identity: Whose quota is charged; a list tries each in turn, and one returning
            None skips the limit. Default None: ``ClientAddress()``.
        cost: Units per request (default 1), or a function of the scope (sync or
            async) returning them.
        per: One quota per identity for the endpoint (``"rule"``, default), per route template
            (``"route"``), or per concrete path (``"path"``).
        fail: ``"open"`` or ``"closed"`` when the backend errs or is too slow;
            default None: each policy's ``on_error``.
        shadow: Decide, report and set headers, but never refuse; default False.
        backend: Where the quotas live; default None: a new ``MemoryRateLimitBackend``,
            for this process only.
        on_decision: A ``DecisionHook`` called (sync or async) with a ``RateLimitEvent``
            for every decision; default None.
        legacy_headers: Also send ``X-RateLimit-Limit``, ``-Remaining`` and ``-Reset``;
            default False.
        limiter: Each rule's limiter settings (budget, retry on error, blocked-key
            cache, clock: ``LimiterSettings``); default None: ``LimiterSettings()``.
        on_refusal: A ``RefusalHook`` shaping the 429/503 (given a ``RefusalContext``,
            it returns a Starlette ``Response``, members for the problem body, or None;
            a hook that raises is logged and the default refusal is sent); default
            None.
        lease: Take the quota from the backend in chunks and decide in process
            (``Leasing``; exact, see docs/ratelimit.md); not for sliding logs. Default
            None.
        max_wait: Seconds a request a rate policy refuses may wait for admission, in
            arrival order, before its 429; default 0: refused at once. A request whose
            client disconnects while it waits leaves (answered 499, nothing charged).
        max_waiting: How many requests may wait at once for this endpoint; past it a
            request that would wait is refused at once. Default 100.
        metering: Reserve an estimate per request and settle the actual cost once the
            response the handler returned has been sent (``Metering``; a value FastAPI
            serializes settles when the handler returns); the request's concurrency
            slot, if any, is then held until then too. Default None.

    Raises:
        TypeError: Both ``policies`` and ``named``, a policies function with other
            policies, or an option of the wrong type.
        ValueError: A bad ``name``, ``per``, ``fail``, ``max_wait`` or ``max_waiting``,
            or more than one ``Concurrency``.
    """
    check_waiting(max_wait, max_waiting)  # now, not when the first endpoint is decorated
    rule = Rule(
        given_policies(policies, named),
        identity=identity,
        cost=cost,
        name=name or "endpoint",
        per=per,
        fail=fail,
        shadow=shadow,
        lease=lease,
        metering=metering,
    )
    make_guard = functools.partial(
        Guard,
        backend=backend,
        identity=None,  # the rule's own, else the client address
        route=routed_template,
        on_decision=on_decision,
        legacy_headers=legacy_headers,
        limiter=limiter,
        on_refusal=on_refusal,
        max_wait=max_wait,
        max_waiting=max_waiting,
    )
    return RateLimitDecorator(rule, name is not None, make_guard)
