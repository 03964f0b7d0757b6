"""Hostile HTTP requests, generated from a seed: what ``test_examples_fuzz`` sends.

``Generator`` varies what an attacker controls (method, request target, Idempotency-Key,
Content-Type, body, credentials and other headers, the peer) and retries some requests;
each ``Fuzzed`` request keeps the input classes it is made of, for the failure report.
"""

from __future__ import annotations

import random
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Headers = list[tuple[bytes, bytes]]
MAX_REQUEST_BODY = 10 << 20  # IdempotencyMiddleware's default max_request_body


@dataclass
class Fuzzed:
    """One request as it arrives on the wire, and the input classes it is made of."""

    method: str
    target: str  # the raw request target (ASCII), query string included
    headers: Headers
    body: bytes
    chunked: bool
    client: tuple[str, int] | None
    labels: list[str] = field(default_factory=list)

    def describe(self) -> str:
        headers = [(k.decode(), v[:80]) for k, v in self.headers]
        return (
            f"{self.method} {self.target[:120]!r} headers={headers} client={self.client} "
            f"body[{len(self.body)}]={self.body[:120]!r}"
        )


def quote(text: str) -> str:
    """Percent-encode what may not appear raw in a request target."""
    return urllib.parse.quote(text, safe="/?&=;:@!$'()*+,-._~%")


class Generator:
    """Hostile requests from a seeded ``random.Random``: the same run every time."""

    known_tokens: tuple[str, ...] = ()  # tokens the app knows, sent now and then

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.serial = 0
        self.keys: list[bytes] = []  # keys sent so far, reused to exercise replays
        self.tokens: list[bytes] = []
        self.recent: list[Fuzzed] = []  # the last requests, some of them retried

    def pick(self, *options: tuple[float, Callable[[], tuple[str, Any]]]) -> tuple[str, Any]:
        weights = [w for w, _ in options]
        _, make = self.rng.choices(options, weights=weights)[0]
        return make()

    def text(self, n: int, alphabet: str = "abcdefghijklmnopqrstuvwxyz0123456789") -> str:
        return "".join(self.rng.choices(alphabet, k=n))

    def garbage(self, n: int) -> bytes:
        return self.rng.randbytes(n)

    def header_bytes(self, n: int) -> bytes:
        """Any bytes an HTTP/1.1 server passes in a header value (no CR, LF, NUL)."""
        allowed = bytes([9, *range(0x20, 0x7F), *range(0x80, 0x100)])
        return bytes(self.rng.choices(allowed, k=n)).strip(b" \t")

    def fresh(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}-{self.serial}"

    # -- what every app gets ------------------------------------------------------------

    def method(self, main: str) -> tuple[str, str]:
        r = self.rng
        return self.pick(
            (70, lambda: ("method:main", main)),
            (15, lambda: ("method:other", r.choice(["GET", "PUT", "PATCH", "DELETE", "POST"]))),
            (5, lambda: ("method:rare", r.choice(["HEAD", "OPTIONS", "TRACE", "CONNECT"]))),
            (5, lambda: ("method:lowercase", main.lower())),
            (5, lambda: ("method:unknown", r.choice(["FOO", "PROPFIND", "X" * 64, "P-O_S.T"]))),
        )

    def query(self) -> tuple[str, str]:
        r = self.rng
        return self.pick(
            (60, lambda: ("query:none", "")),
            (10, lambda: ("query:plain", f"?amount={r.randint(-5, 10**6)}&x={self.text(5)}")),
            (8, lambda: ("query:empty", r.choice(["?", "?&&", "?=", "?a", "?a&a&a=1&a=2"]))),
            (8, lambda: ("query:encoded", r.choice(["?a=%00", "?a=%ff%fe", "?%e9=%c3%a9"]))),
            (6, lambda: ("query:long", "?q=" + "a" * r.choice([5000, 70_000]))),
            (8, lambda: ("query:unicode", "?q=" + quote("π→😀" * r.randint(1, 50)))),
        )

    def idempotency_key(self) -> tuple[str, Headers]:
        r = self.rng

        def one(value: bytes) -> Headers:
            return [(b"idempotency-key", value)]

        def fresh() -> tuple[str, Headers]:
            key = self.fresh(self.text(8)).encode()
            self.keys.append(key)
            return "key:fresh", one(b'"' + key + b'"' if r.random() < 0.7 else key)

        def reused() -> tuple[str, Headers]:
            if not self.keys:
                return fresh()
            return "key:reused", one(b'"' + r.choice(self.keys[-20:]) + b'"')

        return self.pick(
            (55, fresh),
            (8, reused),
            (5, lambda: ("key:missing", [])),
            (3, lambda: ("key:empty", one(r.choice([b"", b'""', b" ", b'" "'])))),
            (4, lambda: ("key:long", one(b'"' + b"k" * r.choice([255, 256, 4096]) + b'"'))),
            (3, lambda: ("key:bare-long", one(b"k" * r.choice([255, 256, 100_000])))),
            (4, lambda: ("key:non-ascii", one(self.header_bytes(r.randint(1, 40))))),
            (
                3,
                lambda: (
                    "key:non-ascii-quoted",
                    one(r.choice([b'"\xc3\xa9t\xc3\xa9"', b'"\xff"', b'"a\x7fb"'])),
                ),
            ),
            (4, lambda: ("key:repeated", one(b'"a"') + one(r.choice([b'"a"', b'"b"', b""])))),
            (
                4,
                lambda: (
                    "key:parameters",
                    one(r.choice([b'"k1";a=1', b'"k2";a', b'"k3"; b=?0;c="x"', b'"k";;'])),
                ),
            ),
            (
                4,
                lambda: (
                    "key:escapes",
                    one(r.choice([b'"a\\"b"', b'"a\\\\b"', b'"a\\x"', b'"a\\', b'"abc', b'"'])),
                ),
            ),
            (
                4,
                lambda: (
                    "key:other-sf-types",
                    one(
                        r.choice(
                            [b"42", b"-1.5", b"?1", b":aGk=:", b'%"caf%c3%a9"', b"@1", b"*t", b"()"]
                        )
                    ),
                ),
            ),
            (
                3,
                lambda: (
                    "key:list",
                    one(r.choice([b'"a", "b"', b'"a","a"', b"a,b", b'("a" "b")'])),
                ),
            ),
        )

    def content_type(self) -> tuple[str, Headers]:
        r = self.rng

        def one(value: bytes) -> Headers:
            return [(b"content-type", value)]

        return self.pick(
            (60, lambda: ("ctype:json", one(b"application/json"))),
            (8, lambda: ("ctype:none", [])),
            (
                10,
                lambda: (
                    "ctype:charset",
                    one(
                        r.choice(
                            [
                                b"application/json; charset=utf-8",
                                b"application/json; charset=latin-1",
                                b"application/json; charset=bogus",
                                b"application/json;charset=",
                                b'application/json; charset="utf-16"',
                            ]
                        )
                    ),
                ),
            ),
            (
                10,
                lambda: (
                    "ctype:wrong",
                    one(
                        r.choice(
                            [
                                b"text/plain",
                                b"application/x-www-form-urlencoded",
                                b"multipart/form-data; boundary=xyz",
                                b"multipart/form-data",
                                b"application/problem+json",
                                b"application/xml",
                                b"*/*",
                                b"",
                            ]
                        )
                    ),
                ),
            ),
            (6, lambda: ("ctype:garbage", one(self.header_bytes(r.randint(1, 60))))),
            (6, lambda: ("ctype:repeated", one(b"application/json") + one(b"text/plain"))),
        )

    def credentials(self) -> tuple[str, Headers]:
        r = self.rng

        def auth(value: bytes) -> Headers:
            return [(b"authorization", value)]

        def fresh() -> tuple[str, Headers]:
            token = self.fresh(self.text(12)).encode()
            self.tokens.append(token)
            return "auth:fresh-bearer", auth(b"Bearer " + token)

        options: list[tuple[float, Callable[[], tuple[str, Any]]]] = [
            (60, fresh),
            (8, lambda: ("auth:none", [])),
            (
                4,
                lambda: (
                    "auth:reused-bearer",
                    auth(b"Bearer " + r.choice(self.tokens or [b"t"])),
                ),
            ),
            (
                6,
                lambda: (
                    "auth:odd-bearer",
                    auth(
                        r.choice([b"Bearer", b"Bearer ", b"bearer x", b"BEARER  y ", b"Bearer\tz"])
                    ),
                ),
            ),
            (4, lambda: ("auth:basic", auth(b"Basic " + self.text(20).encode()))),
            (4, lambda: ("auth:non-ascii", auth(b"Bearer " + self.header_bytes(30)))),
            (2, lambda: ("auth:long", auth(b"Bearer " + b"t" * 20_000))),
            (3, lambda: ("auth:repeated", auth(b"Bearer a") + auth(b"Bearer b"))),
        ]
        if self.known_tokens:
            options.append(
                (
                    12,
                    lambda: (
                        "auth:known",
                        auth(
                            r.choice(["Bearer ", "bearer ", "Bearer  "]).encode()
                            + r.choice(self.known_tokens).encode()
                            + r.choice([b"", b" ", b"x"])
                        ),
                    ),
                )
            )
        label, headers = self.pick(*options)
        if r.random() < 0.15:
            headers = [*headers, (b"x-api-key", self.header_bytes(r.randint(0, 100)))]
        if r.random() < 0.15:
            cookie = r.choice(
                [b"session=abc", b"a=b; c", b";;;=", self.header_bytes(200), b"s=" + b"x" * 9000]
            )
            headers = [*headers, (b"cookie", cookie)]
        return label, headers

    def client(self) -> tuple[str, tuple[str, int] | None]:
        r = self.rng
        return self.pick(
            (80, lambda: ("client:ipv4", (f"198.51.{r.randint(0, 255)}.{r.randint(1, 254)}", 1))),
            (
                15,
                lambda: (
                    "client:ipv6",
                    (f"2001:db8:{r.randint(0, 9999):x}::{r.randint(1, 99)}", 1),
                ),
            ),
            (5, lambda: ("client:none", None)),
        )

    # -- bodies ---------------------------------------------------------------------------

    def number(self) -> tuple[str, bytes]:
        """A JSON number (or what some JSON parsers take for one), as text."""
        r = self.rng
        return self.pick(
            (40, lambda: ("num:positive", str(r.randint(1, 10**9)).encode())),
            (6, lambda: ("num:zero-negative", r.choice([b"0", b"-0", b"-1", b"-99999999"]))),
            (8, lambda: ("num:float", r.choice([b"10.5", b"1.0", b"1e2", b"-0.0", b"1E-400"]))),
            (8, lambda: ("num:overflow-float", r.choice([b"1e999", b"-1e999", b"1E400"]))),
            (8, lambda: ("num:non-finite", r.choice([b"NaN", b"Infinity", b"-Infinity"]))),
            (
                8,
                lambda: (
                    "num:huge-int",
                    b"9" * r.choice([19, 20, 309, 4300, 4301, 5001, 100_000]),
                ),
            ),
            (6, lambda: ("num:bool-null", r.choice([b"true", b"false", b"null"]))),
            (8, lambda: ("num:string", r.choice([b'"1000"', b'"1e999"', b'"\\ud800"', b'""']))),
            (4, lambda: ("num:container", r.choice([b"[]", b"{}", b"[1]", b'{"amount":1}']))),
            (4, lambda: ("num:invalid", r.choice([b"01", b"+1", b"0x10", b"1_000", b".5", b"1."]))),
        )

    def nesting(self) -> tuple[str, bytes]:
        r = self.rng
        depth = r.choice([900, 990, 1000, 2000, 10_000, 50_000, 100_000, r.randint(500, 100_000)])
        opener, closer = r.choice([(b"[", b"]"), (b'{"a":', b"}"), (b'[{"a":', b"}]")])
        inner = opener * depth + b"1" + (closer * depth if r.random() < 0.7 else b"")
        label = f"body:deep-{opener.decode()[:2]}-{'1k' if depth < 5000 else '10k+'}"
        if r.random() < 0.5:
            return label, b'{"amount": ' + inner + b"}"
        return label, inner

    def body(self) -> tuple[str, bytes]:
        """A body for an endpoint whose JSON object is built by ``members`` from a value."""
        r = self.rng

        def valued() -> tuple[str, bytes]:
            label, value = self.number()
            return label, self.members(value)

        return self.pick(
            (45, valued),
            (10, self.nesting),
            (
                6,
                lambda: (
                    "body:duplicate-members",
                    r.choice([b'{"amount": 1, "amount": -1}', b'{"amount": "x", "amount": 5}']),
                ),
            ),
            (
                8,
                lambda: (
                    "body:invalid-json",
                    r.choice(
                        [
                            b"",
                            b" ",
                            b"{",
                            b"}",
                            b"[1,]",
                            b"{'amount': 1}",
                            b'{"amount": 1} trailing',
                            b'{"amount": 1 /* c */}',
                            b"\x00",
                            b'{"amount"\x00: 1}',
                            b'"\\u"',
                        ]
                    ),
                ),
            ),
            (
                8,
                lambda: (
                    "body:not-utf8",
                    r.choice(
                        [
                            b"\xff\xfe\x00",
                            '{"amount": 1, "n": "é"}'.encode("latin-1"),
                            '{"amount": 1}'.encode("utf-16"),
                            '{"amount": 1}'.encode("utf-32"),
                            b"\xef\xbb\xbf" + self.members(b"7"),
                            self.garbage(r.randint(1, 300)),
                        ]
                    ),
                ),
            ),
            (
                5,
                lambda: (
                    "body:odd-strings",
                    r.choice(
                        [
                            b'{"amount": 5, "note": "\\ud800\\udfff\\u0000"}',
                            b'{"\\u0000": 1, "amount": 3}',
                            self.members(b"4")[:-1] + b', "x": "' + "😀".encode() * 1000 + b'"}',
                        ]
                    ),
                ),
            ),
            (4, lambda: ("body:form", b"amount=5&report_id=1")),
            (
                3,
                lambda: (
                    "body:padded",
                    self.members(b"6")[:-1]
                    + b', "pad": "'
                    + b"p" * r.choice([1 << 20, 3 << 20])
                    + b'"}',
                ),
            ),
            (1, lambda: ("body:over-limit", b"[" + b"0," * (MAX_REQUEST_BODY // 2) + b"0]")),
        )

    def extras(self) -> tuple[str, Headers]:
        """The Host header, and others an app may read: forwarding, content negotiation."""
        r = self.rng
        host = [(b"host", b"test")]
        return self.pick(
            (70, lambda: ("extra:none", host)),
            (
                8,
                lambda: (
                    "extra:host",
                    [
                        (
                            b"host",
                            r.choice([b"", b"a:b:c", b"[::1", b"x:99999", b"\xff", b"h" * 3000]),
                        )
                    ],
                ),
            ),
            (4, lambda: ("extra:two-hosts", [*host, (b"host", b"evil.example")])),
            (
                6,
                lambda: (
                    "extra:forwarded",
                    [
                        *host,
                        (b"x-forwarded-for", r.choice([b"1.2.3.4, ::1", b"nope", b"\xff, ,"])),
                        (b"forwarded", r.choice([b"for=1.2.3.4", b'for="[::1]:1"', b"for=;;"])),
                    ],
                ),
            ),
            (
                6,
                lambda: (
                    "extra:negotiation",
                    [
                        *host,
                        (b"accept", r.choice([b"*/*", b"application/problem+json;q=x", b"\xff"])),
                        (
                            b"accept-encoding",
                            r.choice([b"gzip", b"br;q=2", b"identity;q=0, *;q=0"]),
                        ),
                    ],
                ),
            ),
            (4, lambda: ("extra:many", host + [(b"x-h%d" % i, b"v") for i in range(300)])),
        )

    def retry(self) -> Fuzzed:
        """A recent request again: the same, with another body, or with a look-alike key."""
        r = self.rng
        base = r.choice(self.recent)
        kind = r.choice(["same", "other-body", "key-case", "key-space"])
        headers, body = list(base.headers), base.body
        if kind == "other-body":
            body = self.members(str(r.randint(1, 10**6)).encode())
        elif kind == "key-case":
            headers = [(k, v.swapcase() if k == b"idempotency-key" else v) for k, v in headers]
        elif kind == "key-space":  # '"abc"' -> '"abc "': a different key
            headers = [
                (k, v[:-1] + b' "' if k == b"idempotency-key" and v.endswith(b'"') else v)
                for k, v in headers
            ]
        labels = [f"retry:{kind}", *base.labels]
        return Fuzzed(base.method, base.target, headers, body, base.chunked, base.client, labels)

    def request(self, route: Callable[[], tuple[str, str, str]]) -> Fuzzed:
        """One request to ``route()``: (its label, its target, the method it expects)."""
        if self.recent and self.rng.random() < 0.08:
            return self.retry()
        label, path, main_method = route()
        labels = [label]

        def take(pair: tuple[str, Any]) -> Any:
            labels.append(pair[0])
            return pair[1]

        method = take(self.method(main_method))
        target = path + take(self.query())
        headers: Headers = []
        headers += take(self.idempotency_key())
        headers += take(self.content_type())
        headers += take(self.credentials())
        headers += take(self.extras())
        body = take(self.body())
        client = take(self.client())
        self.rng.shuffle(headers)
        chunked = self.rng.random() < 0.1
        if chunked:
            labels.append("body:chunked")
        fuzzed = Fuzzed(method, target, headers, body, chunked, client, labels)
        self.recent = [*self.recent[-9:], fuzzed]
        return fuzzed

    def members(self, value: bytes) -> bytes:
        """The JSON object the endpoint expects, around ``value``."""
        return b'{"amount": ' + value + b"}"


def common_paths(rng: random.Random, main: str) -> list[tuple[str, str]]:
    """Request targets around ``main`` that a server passes on as they came."""
    return [
        ("path:trailing-slash", main + "/"),
        ("path:case", main.upper()),
        ("path:dot-segments", f"/x/..{main}"),
        ("path:dot-segments", f"{main}/../..{main}"),
        ("path:encoded-dots", f"/%2e%2e{main}"),
        ("path:nul", main + "%00"),
        ("path:nul", "/%00" + main),
        ("path:invalid-utf8", main + "%ff%fe"),
        ("path:unicode", quote(main + "/π😀é")),
        ("path:double-slash", "/" + main),
        ("path:long", "/" + "a" * rng.choice([300, 8000, 70_000])),
        ("path:params", main + ";x=1"),
        ("path:backslash", main.replace("/", "%5c")),
        ("path:root", "/"),
        ("path:absolute-form", "http://evil.example" + main),
    ]
