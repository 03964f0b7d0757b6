"""How ``rate_limit``'s wrapper gets the request: the parameters FastAPI fills for it.

Unless the handler takes its own, the wrapper's *advertised* signature adds two
keyword-only parameters FastAPI fills: ``headway_request: Request``, and
``headway_response: Response``, whose headers FastAPI copies onto the response it
builds from a returned value. ``connection`` takes them out of the arguments before
the handler is called, or finds the handler's own request among them (Starlette
passes it).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from starlette.requests import HTTPConnection, Request
from starlette.responses import Response

__all__ = ["advertised", "connection"]

_REQUEST = "headway_request"
_RESPONSE = "headway_response"


def _annotated(params: list[inspect.Parameter], kind: type) -> bool:
    """Whether one of ``params`` is annotated with ``kind`` or a subclass (or its name)."""
    for param in params:
        annotation = param.annotation
        if isinstance(annotation, str):  # unresolved: compare by name
            if annotation.rsplit(".", 1)[-1] == kind.__name__:
                return True
        elif isinstance(annotation, type) and issubclass(annotation, kind):
            return True
    return False


def advertised(func: Callable[..., Any]) -> inspect.Signature:
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


def connection(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[HTTPConnection, Any]:
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
