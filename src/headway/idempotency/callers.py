"""Who sent a request with an Idempotency-Key: the caller its record is filed under.

A stored response may only ever go back to the caller who stored it. The scope
function names the caller (a string: an account, a session, a hashed credential) or
returns None when it cannot tell who is calling. Records of named callers live in a
partition per caller, so another caller's key is invisible (its own request simply
runs). Callers nobody can name share one partition (``UNVERIFIED``) in which nothing
is ever replayed: a key already used there is answered with a conflict, because the
middleware cannot tell a retry from another caller behind the same proxy. See
``docs/idempotency.md`` (threat model) and ``docs/decisions/idempotency.md``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from headway._http import Scope, header
from headway.idempotency.request import digest

__all__ = ["UNVERIFIED", "Caller", "ScopeFunction", "by_credentials", "caller_id", "identify"]

log = logging.getLogger("headway.idempotency")

ScopeFunction = Callable[[Scope], "str | Awaitable[str | None] | None"]
"""Names the caller of a request from its ASGI scope (sync or async); None when it cannot
tell."""


def caller_id(caller: str) -> str:
    """The stored id of a named caller: a fixed-size hash of its name."""
    return digest(caller.encode())


#: The stored id of every caller the scope function could not name. Two parts, so
#: no name hashed by ``caller_id`` (one part) can land in it.
UNVERIFIED = digest(b"headway", b"unverified")


def by_credentials(scope: Scope) -> str | None:
    """The default scope function: the ``Authorization`` header (hashed), else None.

    Cookies and the client address do not name a caller by themselves: a session
    cookie may be re-signed on every response and a proxy gives every caller one
    address. Apps with such callers name them with a scope function
    (``SessionCookie("sid")``, ``AuthenticatedUser()``, ``ApiKey("x-api-key")``).

    Args:
        scope: The request's ASGI scope.
    """
    credentials = header(scope, b"authorization")
    if credentials is None or not credentials.strip():
        return None
    return "auth:" + digest(credentials)


@dataclass(frozen=True, slots=True)
class Caller:
    """A request's caller: its ``id`` (what its records' ``scope`` column holds), and
    whether it is ``named`` (its records may be replayed to it) or in ``UNVERIFIED``."""

    id: str
    named: bool


_UNNAMED = Caller(UNVERIFIED, named=False)


async def identify(scope_function: ScopeFunction, scope: Scope) -> Caller:
    """Run ``scope_function`` (awaiting it if async) and file the request accordingly.

    None or an empty name puts the request in ``UNVERIFIED``. So does a scope function
    that raises or returns something other than a string: it is logged with its
    traceback, and the request still runs at most once and is never replayed to anyone
    (a broken scope function must not leak responses, nor answer 500 to hostile input).
    """
    try:
        name: object = scope_function(scope)
        if inspect.isawaitable(name):
            name = await name
    except Exception:
        log.exception("the idempotency scope function failed; the caller counts as unnamed")
        return _UNNAMED
    if name is not None and not isinstance(name, str):
        log.error("a scope function returns a str or None, not %s", type(name).__name__)
        return _UNNAMED
    if not name:
        return _UNNAMED
    return Caller(caller_id(name), named=True)
