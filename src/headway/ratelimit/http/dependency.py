"""``RateLimitDependency``: a rule as a FastAPI dependency (``Depends(...)``), on the guard.

The dependency asks the same ``Guard`` as the middleware and the decorator.
An admitted request's RateLimit fields go on FastAPI's sub-response, whose
headers FastAPI copies onto the response it builds from a returned value (a
handler that returns its own ``Response`` does not get them: FastAPI copies
nothing onto it). A refused request raises ``RateLimitRefused``, an
``HTTPException``: with ``RateLimitRefused.handler`` registered the client
gets the refusal itself (problem+json, or the ``on_refusal`` hook's
response); without it, FastAPI's own handler still answers 429/503 with
``Retry-After`` and the RateLimit fields, but a ``{"detail": ...}`` body.

A dependency cannot add to a route's OpenAPI: pass ``responses`` (the 429,
and the 503 when the rule can fail closed, as problem+json) to the route or
router. An in-flight slot (``Concurrency``) is held until the dependency
exits (FastAPI closes it once the response is done).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from headway.ratelimit.backends.contract import RateLimitBackend
from headway.ratelimit.http.guard import Guard
from headway.ratelimit.http.identity import Identity
from headway.ratelimit.http.metering import Metering, pending_settles
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
from headway.ratelimit.waiting import DEFAULT_MAX_WAITING

__all__ = ["RateLimitDependency", "RateLimitRefused"]

_HEADERS_SKIPPED = frozenset({b"content-type", b"content-length"})

_PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "format": "uri-reference"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "violated-policies": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["type", "title", "status"],
}


def _documented(description: str, fields: Sequence[str]) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": _PROBLEM_SCHEMA}},
        "headers": {name: {"schema": {"type": "string"}} for name in fields},
    }


class RateLimitRefused(HTTPException):
    """A ``RateLimitDependency`` refused the request; ``response`` is the refusal to send.

    Register ``RateLimitRefused.handler`` for the client to get it:
    ``app.add_exception_handler(RateLimitRefused, RateLimitRefused.handler)``.

    Args:
        response: The refusal (429 or 503), kept as ``.response``; its status, headers
            and problem ``detail`` also make the ``HTTPException``'s.
    """

    def __init__(self, response: Response) -> None:
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in response.raw_headers
            if k not in _HEADERS_SKIPPED
        }
        try:
            detail = str(json.loads(bytes(response.body))["detail"])
        except (ValueError, KeyError, TypeError):  # a hook's own body
            detail = None
        super().__init__(response.status_code, detail=detail, headers=headers)
        self.response = response

    @staticmethod
    async def handler(request: Request, exc: Exception) -> Response:
        """The exception handler sending the refusal (``add_exception_handler``).

        Args:
            request: The refused request (unused).
            exc: The ``RateLimitRefused`` raised.
        """
        assert isinstance(exc, RateLimitRefused)
        return exc.response


class RateLimitDependency:
    """Rate-limit the routes that depend on it: ``dependencies=[Depends(limit)]``.

    Options mean what they mean on ``rate_limit`` and ``Rule``. The quota is one
    per route template (``per="route"``, as fastapi-limiter and slowapi do) unless
    ``per`` says otherwise; keys carry each policy's parameters, so two
    dependencies with different policies never share a quota. Pass
    ``responses=limit.responses`` to the route (or router) to document the
    refusals in OpenAPI.

    Args:
        *policies: The policies: one or several (checked together), a ``Concurrency``
            limit among them, or one function of the request returning them (tiers,
            see ``Rule.policies``).
        named: The policies as a mapping naming each one in the headers, instead of
            ``policies``; default None.
        name: Names the quota in the keys and headers (1-64 letters, digits, ``_``,
            ``.`` or ``-``); default None: ``"default"``.
        identity: Whose quota is charged; a list tries each in turn, and one returning
            None skips the limit. Default None: ``ClientAddress()``.
        cost: Units per request (default 1), or a function of the scope (sync or
            async) returning them.
        per: One quota per identity for the whole dependency (``"rule"``), per route template
            (``"route"``, default), or per concrete path (``"path"``).
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
            arrival order, before its refusal; default 0: refused at once. A request
            whose client disconnects while it waits leaves (nothing charged).
        max_waiting: How many requests may wait at once on this dependency; past it a
            request that would wait is refused at once. Default 100.
        metering: Reserve an estimate per request and settle the actual cost when
            FastAPI runs the dependency's exit code, after the response (``Metering``:
            the units reported to the request's ``Meter``, or a header set on the
            injected ``Response``). Default None.

    Raises:
        TypeError: Both ``policies`` and ``named``, a policies function with other
            policies, or an option of the wrong type.
        ValueError: A bad ``name``, ``per``, ``fail``, ``max_wait`` or ``max_waiting``,
            or more than one ``Concurrency``.
    """

    def __init__(
        self,
        *policies: Limit | PolicyFunction,
        named: Mapping[str, Limit] | None = None,
        name: str | None = None,
        identity: Identity | Sequence[Identity] | None = None,
        cost: int | CostFunction = 1,
        per: Per = "route",
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
    ) -> None:
        rule = Rule(
            given_policies(policies, named),
            identity=identity,
            cost=cost,
            name=name or "default",
            per=per,
            fail=fail,
            shadow=shadow,
            lease=lease,
            metering=metering,
        )
        self.rule = rule
        self.guard = Guard(
            [rule],
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

    @property
    def responses(self) -> dict[int | str, dict[str, Any]]:
        """OpenAPI ``responses`` for the refusals (429; 503 when the rule can fail closed)."""
        fields = ["Retry-After", "RateLimit-Policy", "RateLimit"]
        documented: dict[int | str, dict[str, Any]] = {
            429: _documented("Too Many Requests: a rate limit refused the request.", fields)
        }
        if self._may_fail_closed():
            documented[503] = _documented(
                "Service Unavailable: the rate limit could not be checked.", ["Retry-After"]
            )
        return documented

    def _may_fail_closed(self) -> bool:
        rule = self.rule
        if rule.fail is not None:
            return rule.fail == "closed"
        if rule.dynamic:
            return True  # policies known per request only
        return any(p.on_error == "deny" for p in rule.named_policies().values())

    async def __call__(self, request: Request, response: Response) -> AsyncIterator[None]:
        """Decide (FastAPI injects ``request`` and the sub-response ``response``)."""
        scope = request.scope
        if self.guard.lines is None:
            ruling = await self.guard.decide(scope, scope.get("method", "GET"))
        elif (watched := await decide_watching(self.guard, request)) is None:
            raise HTTPException(499, detail="Client Closed Request")  # nobody reads it
        else:
            ruling = watched
        headers, refusal, slots = ruling
        try:
            if refusal is not None:
                if not isinstance(refusal, Response):
                    status, fields, body = refusal
                    refusal = Response(body, status_code=status)
                    refusal.raw_headers.extend(fields)
                raise RateLimitRefused(refusal)
            response.raw_headers.extend(headers)
            yield
        finally:
            if slots is not None:
                if (meter := pending_settles(scope)) is not None:
                    meter.response(response.status_code or 200, response.raw_headers)
                await slots.aclose()
