"""Who is calling: identities a rate-limit rule charges its quota to.

An identity is any callable taking the ASGI scope and returning a string (or
an awaitable of one), or ``None`` when it does not apply to the request (an
anonymous caller for ``AuthenticatedUser``, no header for ``ApiKey``): a rule
then skips the request. The built-in ones prefix their kind (``ip@``,
``key@``, ``user@``) so that two kinds never share a quota by accident.

Identities are user-controlled strings: the key builder (``_keys.segment``)
escapes or hashes them, and ``ApiKey`` always hashes, so secrets never appear
in Redis key names.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
from collections.abc import Awaitable, Callable, Iterable
from typing import Literal

from headway._http import Scope, header_values

__all__ = ["ApiKey", "AuthenticatedUser", "ClientAddress", "Identity", "SessionCookie"]

Identity = Callable[[Scope], "str | Awaitable[str | None] | None"]
"""Who is calling: a function of the ASGI scope (sync or async) returning a str, or None
when it does not apply to the request (the rule then skips it)."""

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _ip(text: str) -> _Address | None:
    """Parse an address as proxies write it: bare, ``[v6]``, ``v4:port``, ``[v6]:port``."""
    text = text.strip().strip('"')
    if text.startswith("["):
        text = text[1 : text.find("]")] if "]" in text else text
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@functools.lru_cache(maxsize=8192)
def _canonical(text: str, ipv6_prefix: int) -> str:
    """``ip@<address>`` (IPv6 grouped by prefix); parsing is cached, clients come back."""
    address = _ip(text)
    if address is None:
        return f"ip@{text.strip()[:100]}"
    if isinstance(address, ipaddress.IPv6Address) and ipv6_prefix < 128:
        net = ipaddress.IPv6Network((address, ipv6_prefix), strict=False)
        return f"ip@{net.compressed}"
    return f"ip@{address.compressed}"


def _forwarded_for(value: str) -> list[str]:
    """The ``for=`` values of an RFC 7239 ``Forwarded`` field, in order."""
    found = []
    for element in value.split(","):
        for pair in element.split(";"):
            name, _, token = pair.strip().partition("=")
            if name.lower() == "for":
                found.append(token.strip())
    return found


class ClientAddress:
    """The client's IP address, with an explicit rule for which proxies to believe.

    By default it is the socket peer (``scope["client"]``): a forwarding
    header can never change it. Behind proxies, say which to trust, with
    ``trusted_hops`` or ``trusted_proxies`` (not both). A peer-less scope (a Unix
    socket) counts as ``ip@unknown``.

    Args:
        trusted_hops: Exactly N proxies, each appending to the header, sit in front
            of the app; the client is the N-th address from the right (if the header
            has fewer, the peer is used). Default 0: no proxy trusted.
        trusted_proxies: Networks of trusted proxies (``["10.0.0.0/8", ...]``):
            walking the header from the right, starting with the peer, the first
            address outside them is the client (an untrusted peer's header is
            ignored entirely). Default none.
        header: The forwarding header read: ``"x-forwarded-for"`` (default) or
            ``"forwarded"`` (RFC 7239 ``for=``).
        ipv6_prefix: IPv6 clients are grouped by this prefix length, 1 to 128;
            default 64 (a /64 is one site: limiting single addresses in it is
            trivially evaded).

    Raises:
        TypeError: ``trusted_proxies`` is one string, not a list.
        ValueError: A bad network, a negative ``trusted_hops``, both options, an
            unknown ``header`` or an ``ipv6_prefix`` out of range.
    """

    def __init__(
        self,
        *,
        trusted_hops: int = 0,
        trusted_proxies: Iterable[str] = (),
        header: Literal["x-forwarded-for", "forwarded"] = "x-forwarded-for",
        ipv6_prefix: int = 64,
    ) -> None:
        if isinstance(trusted_hops, bool) or not isinstance(trusted_hops, int) or trusted_hops < 0:
            raise ValueError(f"trusted_hops must be an int >= 0, got {trusted_hops!r}")
        if isinstance(trusted_proxies, str):
            raise TypeError("trusted_proxies takes a list of networks, not one string")
        self.trusted: tuple[_Network, ...] = tuple(
            ipaddress.ip_network(n, strict=False) for n in trusted_proxies
        )
        if trusted_hops and self.trusted:
            raise ValueError("give trusted_hops or trusted_proxies, not both")
        if header not in ("x-forwarded-for", "forwarded"):
            raise ValueError(f"header must be 'x-forwarded-for' or 'forwarded', got {header!r}")
        if not 1 <= ipv6_prefix <= 128:
            raise ValueError(f"ipv6_prefix must be between 1 and 128, got {ipv6_prefix}")
        self.hops = trusted_hops
        self.header = header
        self.ipv6_prefix = ipv6_prefix

    def __call__(self, scope: Scope) -> str:
        client = scope.get("client")
        peer = str(client[0]) if client else "unknown"
        if not self.hops and not self.trusted:
            return _canonical(peer, self.ipv6_prefix)  # the default, on every request
        chain = self._chain(scope)
        if self.hops:
            return self._format(chain[-self.hops] if len(chain) >= self.hops else peer)
        for text in [*chain, peer][::-1]:
            address = _ip(text)
            if address is None or not any(address in net for net in self.trusted):
                return self._format(text)
        return self._format(chain[0] if chain else peer)

    def _chain(self, scope: Scope) -> list[str]:
        values = [v.decode("latin-1") for v in header_values(scope, self.header.encode())]
        if self.header == "forwarded":
            return [x for value in values for x in _forwarded_for(value)]
        return [x.strip() for value in values for x in value.split(",") if x.strip()]

    def _format(self, text: str) -> str:
        return _canonical(text, self.ipv6_prefix)

    def __repr__(self) -> str:
        if self.hops:
            return f"ClientAddress(trusted_hops={self.hops}, header={self.header!r})"
        nets = [str(n) for n in self.trusted]
        return f"ClientAddress(trusted_proxies={nets!r}, header={self.header!r})"


class ApiKey:
    """The value of a request header (an API key), hashed: ``key@<digest>``; None if absent.

    Args:
        header: The header's name, in any case; default ``"x-api-key"``.
    """

    def __init__(self, header: str = "x-api-key") -> None:
        self.header = header.lower().encode("latin-1")

    def __call__(self, scope: Scope) -> str | None:
        values = header_values(scope, self.header)
        if not values or not values[0].strip():
            return None
        return "key@" + hashlib.blake2b(values[0].strip(), digest_size=16).hexdigest()

    def __repr__(self) -> str:
        return f"ApiKey({self.header.decode()!r})"


class SessionCookie:
    """A session cookie's value, hashed: ``session@<digest>``; None without the cookie.

    For apps whose callers are known by a cookie the server issues (``sid=...``) and
    keeps for the session. A cookie re-signed on every response (Starlette's
    ``SessionMiddleware``) changes its value between a request and its retry: name
    such callers by what the session holds instead (``AuthenticatedUser()`` or a
    function reading ``scope["session"]``).

    Args:
        name: The cookie's name (``"sid"``).

    Raises:
        ValueError: ``name`` is empty or holds ``=``, ``;``, ``,`` or whitespace.
    """

    def __init__(self, name: str) -> None:
        if not name or any(c in name for c in "=; \t,"):
            raise ValueError(f"not a cookie name: {name!r}")
        self.name = name.encode("latin-1")

    def __call__(self, scope: Scope) -> str | None:
        for field in header_values(scope, b"cookie"):
            for pair in field.split(b";"):
                name, sep, value = pair.strip().partition(b"=")
                # The first one wins, as browsers send the most specific path first.
                if sep and name == self.name:
                    value = value.strip().strip(b'"')
                    if not value:
                        return None
                    return "session@" + hashlib.blake2b(value, digest_size=16).hexdigest()
        return None

    def __repr__(self) -> str:
        return f"SessionCookie({self.name.decode('latin-1')!r})"


class AuthenticatedUser:
    """The authenticated user (``scope["user"]``, as Starlette's AuthenticationMiddleware sets).

    ``user@<identity>`` (or its display name when the user class has no
    identity); None for anonymous requests.
    """

    def __call__(self, scope: Scope) -> str | None:
        user = scope.get("user")
        if user is None or not getattr(user, "is_authenticated", False):
            return None
        try:
            name = user.identity
        except (AttributeError, NotImplementedError):
            name = getattr(user, "display_name", None)
        return None if not name else f"user@{name}"

    def __repr__(self) -> str:
        return "AuthenticatedUser()"
