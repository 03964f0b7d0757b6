"""RateLimitMiddleware on ASGI frameworks whose router it cannot ask (Litestar, Django).

Never a 500: rules match the template the framework recorded, else the raw path.
"""

from __future__ import annotations

import logging
from typing import Any

import django
import pytest
from django.conf import settings
from django.core.asgi import get_asgi_application
from django.http import HttpRequest, HttpResponse
from django.urls import path
from litestar import Litestar, get
from litestar.middleware import DefineMiddleware
from litestar.params import FromPath

from headway import FixedWindow, RateLimitMiddleware, Rule
from tests.ratelimit.apps import client
from tests.windows import NO_ROLLOVER

pytestmark = pytest.mark.anyio

TWO = FixedWindow(limit=2, window=NO_ROLLOVER)


@get("/items/{item_id:int}")
async def item(item_id: FromPath[int]) -> dict[str, int]:
    return {"item": item_id}


@get("/health")
async def health() -> str:
    return "ok"


async def statuses(app: Any, paths: list[str]) -> list[int]:
    async with client(app) as http:
        return [(await http.get(path)).status_code for path in paths]


def route_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "headway.ratelimit" and "raw paths" in r.getMessage()
    ]


async def test_wrapped_around_litestar_rules_match_the_raw_path_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="headway.ratelimit")
    app = Litestar(route_handlers=[item, health], logging_config=None)
    rules = [Rule(TWO, routes=["/items/*"], name="items")]
    # Litestar types its scopes and messages as TypedDicts, not mappings: ASGI all the same.
    limited = RateLimitMiddleware(app, rules=rules)  # type: ignore[arg-type]
    paths = ["/items/1", "/items/2", "/health", "/items/3", "/items/4"]
    assert await statuses(limited, paths) == [200, 200, 200, 429, 429]
    assert len(route_warnings(caplog)) == 1
    assert "Litestar" in route_warnings(caplog)[0]


async def test_inside_litestar_rules_match_the_template_litestar_recorded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="headway.ratelimit")
    rules = [Rule(TWO, routes=["/items/{item_id}"], name="items")]
    app = Litestar(
        route_handlers=[item, health],
        logging_config=None,
        middleware=[DefineMiddleware(RateLimitMiddleware, rules=rules)],  # type: ignore[arg-type]
    )
    paths = ["/items/1", "/items/2", "/health", "/health", "/health", "/items/3"]
    assert await statuses(app, paths) == [200, 200, 200, 200, 200, 429]
    assert route_warnings(caplog) == []


async def django_item(request: HttpRequest, item_id: int) -> HttpResponse:
    return HttpResponse(str(item_id))


urlpatterns = [path("items/<int:item_id>", django_item)]


async def test_wrapped_around_django_rules_match_the_raw_path_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="headway.ratelimit")
    if not settings.configured:  # Django's settings are per process: this module's URLs
        settings.configure(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["test"], INSTALLED_APPS=[])
        django.setup()
    rules = [Rule(TWO, routes=["/items/*"], name="items")]
    # Django types its scope as a dict: ASGI all the same.
    limited = RateLimitMiddleware(get_asgi_application(), rules=rules)  # type: ignore[arg-type]
    paths = ["/items/1", "/items/2", "/items/3", "/items/4"]
    assert await statuses(limited, paths) == [200, 200, 429, 429]
    assert len(route_warnings(caplog)) == 1
