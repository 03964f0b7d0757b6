"""Identities: client address with explicit proxy trust, API keys, authenticated users."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection

from headway import ApiKey, AuthenticatedUser, ClientAddress, FixedWindow, RateLimitEvent, Rule
from headway._http import Scope
from tests.ratelimit.apps import Calls, client, starlette_app
from tests.windows import NO_ROLLOVER

pytestmark = pytest.mark.anyio

ONE = FixedWindow(limit=1, window=NO_ROLLOVER)


def scope(peer: str | None, *headers: tuple[str, str]) -> Scope:
    return {
        "type": "http",
        "client": None if peer is None else (peer, 1234),
        "headers": [(k.encode(), v.encode()) for k, v in headers],
    }


# -- HTTP level: what the issue asks to show -------------------------------------------------


async def test_a_forged_x_forwarded_for_from_an_untrusted_peer_changes_nothing() -> None:
    app = starlette_app(Calls(), rules=[Rule(ONE)])
    async with client(app, ip="203.0.113.5") as http:
        first = await http.get("/users/1", headers={"x-forwarded-for": "198.51.100.1"})
        forged = await http.get("/users/1", headers={"x-forwarded-for": "198.51.100.2"})
    assert first.status_code == 200
    assert forged.status_code == 429  # same peer, same quota, whatever the header says


async def test_x_forwarded_for_from_a_trusted_proxy_names_the_client() -> None:
    identity = ClientAddress(trusted_proxies=["10.0.0.0/8"])
    events: list[RateLimitEvent] = []
    app = starlette_app(Calls(), rules=[Rule(ONE)], identity=identity, on_decision=events.append)
    async with client(app, ip="10.1.2.3") as http:
        one = await http.get("/users/1", headers={"x-forwarded-for": "198.51.100.1"})
        two = await http.get("/users/1", headers={"x-forwarded-for": "198.51.100.2"})
        again = await http.get("/users/1", headers={"x-forwarded-for": "198.51.100.1"})
    assert [one.status_code, two.status_code, again.status_code] == [200, 200, 429]
    assert [e.identity for e in events] == ["ip@198.51.100.1", "ip@198.51.100.2", "ip@198.51.100.1"]
    # The same header from a peer outside the trusted networks is ignored.
    async with client(app, ip="203.0.113.9") as http:
        spoofed = await http.get("/users/1", headers={"x-forwarded-for": "198.51.100.77"})
    assert spoofed.status_code == 200
    assert events[-1].identity == "ip@203.0.113.9"


# -- ClientAddress, rule by rule ---------------------------------------------------------------


def test_by_default_the_socket_peer_is_the_client() -> None:
    address = ClientAddress()
    assert address(scope("192.0.2.1", ("x-forwarded-for", "1.1.1.1"))) == "ip@192.0.2.1"
    assert address(scope("192.0.2.1", ("forwarded", "for=1.1.1.1"))) == "ip@192.0.2.1"
    assert address(scope(None)) == "ip@unknown"


def test_trusted_networks_walk_the_chain_from_the_right() -> None:
    address = ClientAddress(trusted_proxies=["10.0.0.0/8", "fd00::/8"])
    # The client wrote "6.6.6.6" itself; the trusted proxy appended what it saw.
    forged_then_real = ("x-forwarded-for", "6.6.6.6, 198.51.100.4")
    assert address(scope("10.0.0.1", forged_then_real)) == "ip@198.51.100.4"
    # Two trusted hops: both are skipped.
    assert address(scope("10.0.0.1", ("x-forwarded-for", "198.51.100.4, 10.9.9.9"))) == (
        "ip@198.51.100.4"
    )
    # Several header lines form one list, in order.
    lines = (("x-forwarded-for", "6.6.6.6"), ("x-forwarded-for", "198.51.100.4, 10.0.0.7"))
    assert address(scope("10.0.0.1", *lines)) == "ip@198.51.100.4"
    # Everything trusted: the leftmost address is the best we know.
    assert address(scope("10.0.0.1", ("x-forwarded-for", "10.0.0.2"))) == "ip@10.0.0.2"
    # No header from a trusted proxy: the proxy itself.
    assert address(scope("10.0.0.1")) == "ip@10.0.0.1"
    # Garbage in the header is an untrusted hop: it becomes an identity, safely escaped later.
    assert address(scope("10.0.0.1", ("x-forwarded-for", "not-an-ip"))) == "ip@not-an-ip"


def test_trusted_hops_count_from_the_right() -> None:
    one = ClientAddress(trusted_hops=1)
    two = ClientAddress(trusted_hops=2)
    header = ("x-forwarded-for", "6.6.6.6, 198.51.100.4, 10.0.0.2")
    assert one(scope("10.0.0.1", header)) == "ip@10.0.0.2"
    assert two(scope("10.0.0.1", header)) == "ip@198.51.100.4"
    # Fewer entries than hops: the header cannot be right, the peer is used.
    assert two(scope("10.0.0.1", ("x-forwarded-for", "198.51.100.4"))) == "ip@10.0.0.1"


def test_the_forwarded_header() -> None:
    address = ClientAddress(trusted_proxies=["10.0.0.0/8"], header="forwarded")
    value = 'for=6.6.6.6, for="198.51.100.4:4711";proto=https;by=10.0.0.1, For=10.0.0.3'
    assert address(scope("10.0.0.1", ("forwarded", value))) == "ip@198.51.100.4"
    v6 = ClientAddress(trusted_proxies=["10.0.0.0/8"], header="forwarded", ipv6_prefix=128)
    bracketed = ("forwarded", 'for="[2001:db8:cafe::17]:4711"')
    assert v6(scope("10.0.0.1", bracketed)) == "ip@2001:db8:cafe::17"
    hidden = ("forwarded", "for=_hidden")
    assert address(scope("10.0.0.1", hidden)) == "ip@_hidden"


def test_ipv6_clients_are_grouped_by_prefix_and_mapped_ipv4_unwrapped() -> None:
    address = ClientAddress()
    assert address(scope("2001:db8:1:2:aaaa::1")) == "ip@2001:db8:1:2::/64"
    assert address(scope("2001:db8:1:2:bbbb::9")) == "ip@2001:db8:1:2::/64"
    assert ClientAddress(ipv6_prefix=48)(scope("2001:db8:1:2::1")) == "ip@2001:db8:1::/48"
    assert address(scope("::ffff:192.0.2.7")) == "ip@192.0.2.7"


def test_client_address_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="not both"):
        ClientAddress(trusted_hops=1, trusted_proxies=["10.0.0.0/8"])
    with pytest.raises(ValueError, match="trusted_hops"):
        ClientAddress(trusted_hops=-1)
    with pytest.raises(TypeError, match="list of networks"):
        ClientAddress(trusted_proxies="10.0.0.0/8")
    with pytest.raises(ValueError, match="does not appear to be"):
        ClientAddress(trusted_proxies=["ten"])
    with pytest.raises(ValueError, match="header"):
        ClientAddress(header="x-real-ip")  # type: ignore[arg-type]


# -- other identities --------------------------------------------------------------------------


def test_api_keys_are_hashed_never_stored_as_given() -> None:
    key = ApiKey("authorization")
    found = key(scope("192.0.2.1", ("authorization", "Bearer s3cret")))
    assert found is not None
    assert found.startswith("key@")
    assert "s3cret" not in found
    assert found == key(scope("198.51.100.1", ("authorization", "Bearer s3cret")))
    assert key(scope("192.0.2.1")) is None


class HeaderAuth(AuthenticationBackend):
    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, Any] | None:
        name = conn.headers.get("x-user")
        return None if name is None else (AuthCredentials(["authenticated"]), SimpleUser(name))


async def test_authenticated_users_have_their_own_quota_and_anonymous_fall_back() -> None:
    calls = Calls()
    app = starlette_app(
        calls,
        rules=[Rule(ONE, identity=[AuthenticatedUser(), ClientAddress()])],
    )
    app.user_middleware.insert(0, Middleware(AuthenticationMiddleware, backend=HeaderAuth()))
    async with client(app, ip="192.0.2.50") as http:
        alice = [(await http.get("/users/1", headers={"x-user": "alice"})).status_code]
        alice.append((await http.get("/users/1", headers={"x-user": "alice"})).status_code)
        bob = (await http.get("/users/1", headers={"x-user": "bob"})).status_code
        anonymous = [(await http.get("/users/1")).status_code for _ in range(2)]
    assert alice == [200, 429]
    assert bob == 200
    assert anonymous == [200, 429]
    assert AuthenticatedUser()(scope("192.0.2.1")) is None
