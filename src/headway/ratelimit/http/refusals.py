"""``on_refusal``: the user's hook shaping a 429 or 503, applied by the guard.

The guard builds the default refusal first (status, headers, problem+json
body). When the middleware, the decorator or the dependency has an
``on_refusal`` hook, it is called (sync or async) with a ``RefusalContext``
and returns:

- ``None``: the default refusal is sent;
- a mapping: members merged into the default problem body (``status`` is the
  response's and cannot be replaced); a hook may replace ``title``,
  ``detail`` or ``type``;
- a Starlette ``Response``: sent as it is (the context's ``headers`` hold
  ``Retry-After`` and the RateLimit fields to copy onto it).

A hook that raises, or returns anything else, is logged (``headway.ratelimit``)
and the default refusal is sent: a broken hook never turns a refusal into a 500.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from headway._http import Scope
from headway.ratelimit.decision import Decision
from headway.ratelimit.http.bound_rule import BoundRule
from headway.ratelimit.http.headers import Refusal
from headway.ratelimit.http.rules import RuleAnswer

__all__ = ["RefusalAnswer", "RefusalContext", "RefusalHook", "Refuser"]

log = logging.getLogger("headway.ratelimit")

#: Response headers the default refusal sets for its own body (not offered to hooks).
_BODY_HEADERS = frozenset({b"content-type", b"content-length"})


@dataclass(frozen=True, slots=True)
class RefusalContext:
    """What an ``on_refusal`` hook knows about a refused request.

    Attributes:
        rule: The refusing rule's name.
        status: 429 (a quota or in-flight limit refused) or 503 (the rule failed
            closed: ``decision.failed``).
        violated: The names of the policies that refused (empty on 503).
        decision: The limiter's ``Decision`` (or a ``Concurrency`` limit's
            ``Admission``).
        retry_after: The default ``Retry-After``, in whole seconds.
        headers: The default refusal's header fields (``Retry-After``,
            ``Cache-Control``, RateLimit fields) by lower-case name.
        problem: The default problem+json body.
        scope: The request's ASGI scope.
    """

    rule: str
    status: int
    violated: tuple[str, ...]
    decision: RuleAnswer
    retry_after: int
    headers: Mapping[str, str]
    problem: Mapping[str, Any]
    scope: Scope


RefusalAnswer = Response | Mapping[str, Any] | None
RefusalHook = Callable[[RefusalContext], "RefusalAnswer | Awaitable[RefusalAnswer]"]
"""The ``on_refusal`` hook (sync or async): given a ``RefusalContext``, returns None (the
default refusal), a mapping of problem members to merge, or a Starlette ``Response``."""


def _violated(rule: BoundRule, answer: RuleAnswer) -> tuple[str, ...]:
    if answer.failed:
        return ()
    if not isinstance(answer, Decision):
        return (rule.slot_name,)
    parts = zip(rule.names, answer.policies, strict=True)
    return tuple(name for name, part in parts if not part.allowed) or tuple(rule.names[:1])


class Refuser:
    """Applies one ``on_refusal`` hook to the guard's default refusals."""

    def __init__(self, hook: RefusalHook) -> None:
        self.hook = hook

    async def __call__(
        self, rule: BoundRule, answer: RuleAnswer, refusal: Refusal, scope: Scope
    ) -> Refusal | Response:
        """The refusal to send: the hook's, or ``refusal`` when it declines or fails."""
        status, headers, body = refusal
        fields = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers}
        problem = json.loads(body)
        context = RefusalContext(
            rule=rule.name,
            status=status,
            violated=_violated(rule, answer),
            decision=answer,
            retry_after=int(fields.get("retry-after", "1")),
            headers={k: v for k, v in fields.items() if k.encode() not in _BODY_HEADERS},
            problem=problem,
            scope=scope,
        )
        try:
            answered = self.hook(context)
            if inspect.isawaitable(answered):
                answered = await answered
            shaped = _shaped(answered, problem)
        except Exception:
            # The hook is user code shaping an error: its own error must not become a 500.
            log.exception("rate limit on_refusal hook failed; sending the default refusal")
            return refusal
        if shaped is None:
            return refusal
        if isinstance(shaped, Response):
            return shaped
        return status, headers, shaped


def _shaped(answered: object, problem: dict[str, Any]) -> Response | bytes | None:
    """A hook's answer checked: its response, the extended problem body, or None."""
    if answered is None or isinstance(answered, Response):
        return answered
    if not isinstance(answered, Mapping):
        raise TypeError(
            f"returned {answered!r}: expected a Response, a mapping of problem members, or None"
        )
    if "status" in answered:
        raise ValueError("a problem member 'status' cannot be replaced")
    return json.dumps({**problem, **answered}, separators=(",", ":")).encode()
