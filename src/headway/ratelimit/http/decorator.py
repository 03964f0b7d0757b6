"""``rate_limit``: the middleware's checks for one endpoint (Starlette and FastAPI).

The handler keeps its signature (``ParamSpec``) and need not take a
``request``: the wrapper finds it among the arguments (Starlette passes it),
or asks FastAPI for it through keyword-only parameters it adds to the
*advertised* signature (``headway_request: Request``, and
``headway_response: Response`` whose headers FastAPI copies onto the
response it builds from a returned value), unless the handler takes its own.
The wrapper removes them before calling the handler. FastAPI validates the
request before calling the handler, so an invalid request gets its 422
without being charged; the middleware, in contrast, limits before parsing.

``async def`` handlers are awaited. ``def`` handlers stay synchronous, so
the frameworks still run them in their thread pool; there the wrapper runs
the limiter on the event loop with ``anyio.from_thread.run``. A concurrency
slot is held while the handler runs and released when it returns or raises
(the response it returns is then sent without the slot).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import re
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Literal, ParamSpec, TypeVar, overload

import anyio.from_thread
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response

from headway._clock import Clock
from headway.ratelimit.backends.contract import RateLimitBackend
from headway.ratelimit.http.guard import Check, DecisionHook, Guard
from headway.ratelimit.http.identity import ClientAddress, Identity
from headway.ratelimit.http.rules import CostFunction, Limit, Per, Rule

__all__ = ["RateLimitDecorator", "rate_limit"]

P = ParamSpec("P")
R = TypeVar("R")

_REQUEST = "headway_request"
_RESPONSE = "headway_response"
_IDENTIFIER = re.compile(r"[A-Za-z0-9_]{1,64}")


def _annotated(params: list[inspect.Parameter], kind: type) -> bool:
    for param in params:
        annotation = param.annotation
        if isinstance(annotation, str):  # unresolved: compare by name
            if annotation.rsplit(".", 1)[-1] == kind.__name__:
                return True
        elif isinstance(annotation, type) and issubclass(annotation, kind):
            return True
    return False


def _advertised(func: Callable[..., Any]) -> inspect.Signature:
    """``func``'s signature plus the keyword-only parameters FastAPI fills for us.

    FastAPI passes the request (and the sub-response) to one parameter only,
    so a handler that already takes one keeps it and gets none of ours.
    """
    try:
        signature = inspect.signature(func, eval_str=True)
    except NameError:
        signature = inspect.signature(func)
    params = list(signature.parameters.values())
    extra = []
    if not _annotated(params, HTTPConnection):
        extra.append(
            inspect.Parameter(_REQUEST, inspect.Parameter.KEYWORD_ONLY, annotation=Request)
        )
    if not _annotated(params, Response):
        extra.append(
            inspect.Parameter(_RESPONSE, inspect.Parameter.KEYWORD_ONLY, annotation=Response)
        )
    at = next((i for i, p in enumerate(params) if p.kind is p.VAR_KEYWORD), len(params))
    return signature.replace(parameters=[*params[:at], *extra, *params[at:]])


def _connection(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[HTTPConnection, Any]:
    """The request (FastAPI's injected one, or the handler's own) and FastAPI's sub-response."""
    request = kwargs.pop(_REQUEST, None)
    response = kwargs.pop(_RESPONSE, None)
    if request is not None and response is not None:  # FastAPI gave both (the usual case)
        return request, response
    values = (*args, *kwargs.values())
    if request is None:
        found = [a for a in values if isinstance(a, HTTPConnection)]
        if not found:
            raise TypeError("rate_limit: no request among the arguments (is this an endpoint?)")
        request = found[0]
    if response is None:
        response = next((a for a in values if isinstance(a, Response)), None)
    return request, response


def _route(request: HTTPConnection) -> str | None:
    route = request.scope.get("route")
    template = getattr(route, "path_format", None)
    return template if isinstance(template, str) else None


def _finish(check: Check, result: Any, sub_response: Any) -> Any:
    if check.blocking is not None:
        status, headers, body = check.refusal()
        refusal = Response(body, status_code=status)
        refusal.raw_headers.extend(headers)
        return refusal
    headers = check.headers()
    if isinstance(result, Response):
        result.raw_headers.extend(headers)
    elif isinstance(sub_response, Response):
        sub_response.raw_headers.extend(headers)
    return result


class RateLimitDecorator:
    """Applies one rule to each endpoint it decorates (see ``rate_limit``)."""

    def __init__(self, rule: Rule, named: bool, options: dict[str, Any]) -> None:
        self.rule = rule
        self.named = named
        self.options = options

    def _guard(self, func: Callable[..., Any]) -> Guard:
        rule = self.rule
        if not self.named:
            name = func.__name__ if _IDENTIFIER.fullmatch(func.__name__) else "endpoint"
            rule = Rule(**{**_fields(rule), "name": name})
        guard = Guard([rule], **self.options)
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

        async def check(request: HTTPConnection) -> Check:
            method = request.scope.get("method", "GET")
            return await guard.check(request.scope, method, _route(request))

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                request, sub_response = _connection(args, kwargs)
                scope = request.scope
                decided = await guard.check(scope, scope.get("method", "GET"), _route(request))
                try:
                    if decided.blocking is not None:
                        return _finish(decided, None, None)
                    return _finish(decided, await func(*args, **kwargs), sub_response)
                finally:
                    if decided.slots:
                        await decided.release()

            wrapper: Callable[P, Any] = async_wrapper
        else:

            @functools.wraps(func)
            def sync_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                request, sub_response = _connection(args, kwargs)
                decided = anyio.from_thread.run(check, request)
                try:
                    if decided.blocking is not None:
                        return _finish(decided, None, None)
                    return _finish(decided, func(*args, **kwargs), sub_response)
                finally:
                    if decided.slots:  # else nothing to free: no trip to the event loop
                        anyio.from_thread.run(decided.release)

            wrapper = sync_wrapper
        wrapper.__signature__ = _advertised(func)  # type: ignore[attr-defined]
        wrapper.guard = guard  # type: ignore[attr-defined]
        return wrapper


def _fields(rule: Rule) -> dict[str, Any]:
    return {name: getattr(rule, name) for name in Rule.__dataclass_fields__}


def rate_limit(
    *policies: Limit,
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
    budget: float = 0.25,
    retry_on_error: float = 1.0,
    cache_blocked: bool | int = False,
    clock: Clock | None = None,
) -> RateLimitDecorator:
    """Rate-limit one endpoint with ``policies`` (or ``named`` policies), like a middleware rule.

    Options mean what they mean on ``Rule`` and ``RateLimitMiddleware``. The
    quota is the endpoint's own: ``name`` (default: the function's name) names
    it in the headers; give two endpoints the same ``name`` and ``backend`` to
    share one quota. A refusal is returned as the response (429 or 503,
    problem+json); otherwise the handler runs and its response carries the
    RateLimit header fields.
    """
    if named is not None and policies:
        raise TypeError("give policies or named policies, not both")
    rule = Rule(
        named if named is not None else policies,
        identity=identity,
        cost=cost,
        name=name or "endpoint",
        per=per,
        fail=fail,
        shadow=shadow,
    )
    options: dict[str, Any] = {
        "backend": backend,
        "identity": ClientAddress(),
        "on_decision": on_decision,
        "legacy_headers": legacy_headers,
        "budget": budget,
        "retry_on_error": retry_on_error,
        "cache_blocked": cache_blocked,
        "clock": clock,
    }
    return RateLimitDecorator(rule, name is not None, options)
