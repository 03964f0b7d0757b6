"""RateLimit header fields: built by headway, parsed by an independent SF parser (http_sfv)."""

from __future__ import annotations

import http_sf
import pytest
from http_sf.types import ListType, ParamsType
from http_sfv.list import List as SfvList

from headway import Decision, FixedWindow, PolicyDecision, SlidingLog, Source, TokenBucket
from headway.ratelimit.http.headers import (
    legacy_headers,
    limit_items,
    policy_item,
    retry_after,
    seconds,
    sf_string,
)

BURST = TokenBucket(capacity=10, rate=10, period=1.0)
HOURLY = SlidingLog(limit=1000, window=3600.0)


def parse_list(value: str) -> list[tuple[object, dict[str, object]]]:
    """Parse a List with http_sfv (not the library that serialized it)."""
    parsed = SfvList()
    parsed.parse(value.encode("ascii"))
    return [(item.value, dict(item.params)) for item in parsed]


def sf_list(*items: tuple[str, dict[str, int]]) -> str:
    """The whole List serialized by http_sf (what the hand-formatted parameters must equal)."""
    structure: ListType = []
    for name, params in items:
        typed: ParamsType = dict(params)
        structure.append((name, typed))
    return http_sf.ser(structure)


def decision(*parts: PolicyDecision, allowed: bool, retry: float = 0.0) -> Decision:
    first = parts[0]
    return Decision(
        allowed=allowed,
        limit=first.policy.limit,
        remaining=first.remaining,
        reset_after=first.reset_after,
        retry_after=retry,
        policy=first.policy,
        policies=parts,
    )


def test_seconds_round_up_and_never_go_negative() -> None:
    assert [seconds(x) for x in (-1.0, 0.0, 1e-6, 1.0, 1.000001, 59.2)] == [0, 0, 1, 1, 2, 60]


def test_one_policy_item_parses_with_an_independent_parser() -> None:
    item = policy_item("default", FixedWindow(limit=100, window=10.0))
    assert item == sf_list(("default", {"q": 100, "w": 10}))
    assert parse_list(item) == [("default", {"q": 100, "w": 10})]


def test_several_policies_form_one_list() -> None:
    value = ", ".join([policy_item("burst", BURST), policy_item("hourly", HOURLY)])
    assert parse_list(value) == [
        ("burst", {"q": 10, "w": 1}),
        ("hourly", {"q": 1000, "w": 3600}),
    ]


def test_windows_are_whole_seconds_rounded_up_and_at_least_one() -> None:
    fast = FixedWindow(limit=5, window=0.25)
    odd = TokenBucket(capacity=3, rate=1, period=2.5)  # refills fully in 7.5 s
    assert parse_list(policy_item("fast", fast))[0][1]["w"] == 1
    assert parse_list(policy_item("odd", odd))[0][1]["w"] == 8


def test_concurrency_items_carry_their_quota_unit() -> None:
    item = policy_item("inflight", FixedWindow(limit=4, window=60.0), "concurrent-requests")
    assert parse_list(item) == [("inflight", {"q": 4, "qu": "concurrent-requests", "w": 60})]


@pytest.mark.parametrize("name", ["", "caf\u00e9", "line\nbreak", "tab\t"])
def test_names_a_string_cannot_carry_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="name"):
        sf_string(name)


def test_quotes_and_backslashes_in_names_are_escaped() -> None:
    value = policy_item('say "hi" \\ there', BURST)
    assert parse_list(value)[0][0] == 'say "hi" \\ there'


def test_limit_items_for_an_admitted_request() -> None:
    parts = (
        PolicyDecision(BURST, True, 7, 0.3, 0.0),
        PolicyDecision(HOURLY, True, 990, 3599.2, 0.0),
    )
    names = [sf_string("burst"), sf_string("hourly")]
    value = ", ".join(limit_items(names, decision(*parts, allowed=True)))
    assert value == sf_list(("burst", {"r": 7, "t": 1}), ("hourly", {"r": 990, "t": 3600}))
    assert parse_list(value) == [("burst", {"r": 7, "t": 1}), ("hourly", {"r": 990, "t": 3600})]


def test_a_rejecting_policy_reports_its_retry_and_retry_after_is_never_earlier() -> None:
    parts = (
        PolicyDecision(BURST, False, 0, 1.0, 2.2),
        PolicyDecision(HOURLY, True, 990, 3599.2, 0.0),
    )
    rejected = decision(*parts, allowed=False, retry=2.2)
    items = parse_list(", ".join(limit_items([sf_string("b"), sf_string("h")], rejected)))
    assert items == [("b", {"r": 0, "t": 3}), ("h", {"r": 990, "t": 3600})]
    assert retry_after([rejected]) == 3 >= items[0][1]["t"]  # type: ignore[operator]


def test_retry_after_is_at_least_one_second() -> None:
    parts = (PolicyDecision(BURST, False, 0, 0.0, 0.0),)
    assert retry_after([decision(*parts, allowed=False, retry=0.0)]) == 1


def test_a_failure_mode_decision_has_no_items() -> None:
    failed = Decision(False, 10, 0, 0.0, 1.0, BURST, source=Source.FAILED_CLOSED)
    assert limit_items([sf_string("burst")], failed) == []


def test_legacy_headers_use_the_decision_numbers() -> None:
    parts = (PolicyDecision(BURST, True, 7, 0.3, 0.0),)
    assert legacy_headers(decision(*parts, allowed=True)) == [
        (b"x-ratelimit-limit", b"10"),
        (b"x-ratelimit-remaining", b"7"),
        (b"x-ratelimit-reset", b"1"),
    ]
