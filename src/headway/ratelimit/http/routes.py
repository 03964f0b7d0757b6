"""Find a request's route template (``/users/{id}``) before the app routes it.

A middleware runs before the router, so it asks the router's routes the same
question the router will: each route's ``matches(scope)``, first full match
wins, else the first partial one (a wrong method: the route still names the
request). Mounts are searched recursively and their prefix joined to the
inner template; a mounted app without routes (static files) is named
``<prefix>/{path}``. FastAPI's lazily included routers are searched through
their candidates, which carry the prefixed templates. Convertors are dropped
(``{id:int}`` -> ``{id}``) so rules are written the way paths read.

The routes come from ``scope["app"]`` (which Starlette and FastAPI set before
running their middleware stack) or, for a middleware wrapped around the app
by hand, from the wrapped app (followed through ``.app`` attributes). Routes
of another kind (Litestar's), or no routes at all, leave the template the
framework records in the scope once it has routed (``routed_template``:
Starlette's ``scope["route"]``, Litestar's ``scope["path_template"]``), which a
middleware placed after routing sees; failing that, rules match the raw path
and a warning says so, once. Any other framework can pass its own ``route=``
function to the middleware.
"""

from __future__ import annotations

import collections
import enum
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from starlette.routing import Match

from headway._http import Scope

__all__ = ["RouteCache", "RouteFunction", "routed_template"]

RouteFunction = Callable[[Scope], "str | None"]

log = logging.getLogger("headway.ratelimit")

_CONVERTOR = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*):[^}]*\}")


def _routes_of(app: Any) -> Sequence[Any] | None:
    for _ in range(16):  # middleware chains are short; a cycle must not hang us
        if app is None:
            return None
        routes = getattr(app, "routes", None)
        if isinstance(routes, list):
            return routes
        app = getattr(app, "app", None)
    return None


def _candidates(route: Any) -> list[Any] | None:
    """The routes inside ``route``: a Mount's or Host's, or a lazily included FastAPI router's."""
    effective = getattr(route, "effective_candidates", None)
    if callable(effective):
        # FastAPI >= 0.16x keeps included routers as one route; its candidates carry the
        # prefixed template (``path_format``) or a prefixed Starlette route.
        return [getattr(c, "starlette_route", None) or c for c in effective()]
    inner = getattr(route, "routes", None)
    return inner if isinstance(inner, list) else None


class _ForeignRoute(Exception):
    """A route that is not Starlette's: its router cannot be asked before routing."""


class _Unreadable(enum.Enum):
    """What the route cache holds for a request whose router is not Starlette's."""

    ROUTER = "router"


# A module global: reading an enum member through its class costs the cache hit ~90 ns.
_UNREADABLE = _Unreadable.ROUTER


def _search(routes: Sequence[Any], scope: Scope) -> tuple[bool, str | None]:
    """(full match?, template) of the route the router would pick, else (False, None)."""
    partial: str | None = None
    for route in routes:
        inner = _candidates(route)
        if inner is not None and hasattr(route, "effective_candidates"):
            full, template = _search(inner, scope)
        else:
            matches = getattr(route, "matches", None)
            if matches is None:
                raise _ForeignRoute
            match, child = matches(scope)
            if match is Match.NONE:
                continue
            full = match is Match.FULL
            if inner is None:
                template = getattr(route, "path_format", None) or getattr(route, "path", "")
            elif inner:  # a Mount or a Host with routes: look inside, after its prefix
                prefix = getattr(route, "path", "")
                found = _search(inner, {**scope, **child})[1]
                template = None if found is None else prefix + found
            else:  # a mounted app without routes (static files...)
                template = getattr(route, "path", "") + "/{path}"
        if full:  # where the router stops, even if nothing inside a mount matches
            return True, template
        if partial is None:
            partial = template
    return False, partial


def _template(routes: Sequence[Any], scope: Scope) -> str | _Unreadable | None:
    try:
        template = _search(routes, scope)[1]
    except _ForeignRoute:
        return _UNREADABLE
    if template is None or ":" not in template:
        return template
    return _CONVERTOR.sub(r"{\1}", template)


def routed_template(scope: Scope) -> str | None:
    """The template of the route the framework has already matched, if it records it.

    Starlette and FastAPI record the route (``scope["route"]``), Litestar the
    template (``scope["path_template"]``).
    """
    template = getattr(scope.get("route"), "path_format", None) or scope.get("path_template")
    return template if isinstance(template, str) else None


class RouteCache:
    """The template of the Starlette/FastAPI route that will serve a request, or None.

    For another framework: the template it recorded, if it has routed
    already; else None, with a warning the first time.

    Behind a small LRU cache of recently seen requests: its key holds
    everything routing reads (method, path, root path, host), and it is
    emptied when the route list changes (another list, or routes added), so a
    route added later is seen; the cache is bounded, so paths full of ids
    cannot grow it.
    """

    def __init__(self, app: Any, size: int = 4096) -> None:
        self.app = app
        self.size = size
        self.cache: collections.OrderedDict[tuple[Any, ...], str | _Unreadable | None] = (
            collections.OrderedDict()
        )
        # The route list the cache was filled from (held: another list is never taken
        # for it), and its length then.
        self.routes: Sequence[Any] | None = None
        self.count = 0
        self.warned = False

    def __call__(self, scope: Scope) -> str | None:
        routes = _routes_of(scope.get("app")) or _routes_of(self.app)
        if routes is None:
            return self._recorded(scope)
        host = None
        for name, value in scope.get("headers", ()):
            if name.lower() == b"host":
                host = value
                break
        if routes is not self.routes or len(routes) != self.count:
            self.cache.clear()
            self.routes, self.count = routes, len(routes)
        key = (
            scope["type"], scope.get("method"), scope.get("root_path", ""), scope["path"], host
        )  # fmt: skip
        try:
            self.cache.move_to_end(key)
            template = self.cache[key]
        except KeyError:
            template = self.cache[key] = _template(routes, scope)
            if len(self.cache) > self.size:
                self.cache.popitem(last=False)
        return template if template is not _UNREADABLE else self._recorded(scope)

    def _recorded(self, scope: Scope) -> str | None:
        """The template the framework recorded, else None (rules match the raw path)."""
        template = routed_template(scope)
        if template is None and not self.warned:
            # Once: the cause is the app's framework, the same for every request.
            self.warned = True
            app = scope.get("app") or self.app
            log.warning(
                "rate-limit rules match raw paths, not route templates: no router this "
                "middleware can read before routing in %s (pass route= to the middleware, "
                "or place it after the framework's routing)",
                type(app).__name__,
            )
        return template
