"""The algorithm table agrees with the policies and with the Lua fragments' contract headers."""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Any

import pytest

from headway import (
    FixedWindow,
    LeakyBucket,
    Leasing,
    RateLimiter,
    SlidingCounter,
    SlidingLog,
    SyncRateLimiter,
    TokenBucket,
)
from headway._redis.scripts import Script
from headway.ratelimit import algorithms, lease_model, model, settle_model
from headway.ratelimit.algorithms import ALGORITHMS, Algorithm, PolicySet, algorithm_of
from headway.ratelimit.backends.redis_scripts import decide_script, lease_script
from headway.ratelimit.lease_model import BucketLease, NotLeased, WindowLease
from headway.ratelimit.policies import Policy

COMMON = Script("ratelimit/common").source
CLOCK = Script("clock").source
LEASING = Script("ratelimit/leasing").source
SETTLING = Script("ratelimit/settling").source


def _header(source: str) -> str:
    return "".join(line + "\n" for line in source.splitlines() if line.startswith("--"))


def _defined_by(library: str) -> set[str]:
    """What a library script says it defines, checked against what it does define."""
    header = _header(library).split("DEFINES", 1)[1]
    listed = set(re.findall(r"^--   (\w+)", header, re.MULTILINE))
    defined = set(re.findall(r"^local function (\w+)", library, re.MULTILINE))
    defined |= set(re.findall(r"^local (\w+) = ", library, re.MULTILINE))
    assert listed == defined
    return listed


def _defined_by_common() -> set[str]:
    return _defined_by(COMMON)


def _needs(header: str) -> dict[str, set[str]]:
    """A fragment's NEEDS line: the names it takes, by the file it takes them from."""
    (line,) = re.findall(r"^-- NEEDS +(.*)$", header, re.MULTILINE)
    needs = {}
    for part in line.split(";"):
        source, names = part.strip().removeprefix("from ").split(":")
        needs[source] = {name.strip() for name in names.split(",")}
    return needs


def test_every_policy_class_has_one_kind() -> None:
    assert len({a.kind for a in ALGORITHMS}) == len(ALGORITHMS)
    assert {a.policy for a in ALGORITHMS} == set(typing.get_args(Policy))
    assert len({a.fragment for a in ALGORITHMS}) == len(ALGORITHMS)


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: a.policy.name)
def test_each_fragment_declares_what_it_needs_and_registers(algorithm: Algorithm) -> None:
    source = Script(algorithm.fragment).source
    header = _header(source)
    body = source[len(header) :]
    # It registers exactly its own kind, with the state kind the table says.
    assert re.findall(r"^algorithms\[(\d+)\] = ", body, re.MULTILINE) == [str(algorithm.kind)]
    assert f"REGISTERS   algorithms[{algorithm.kind}]" in header
    assert ("string_state = true" in body) is algorithm.string_state
    # It uses nothing from the library script that its header does not name.
    (needs,) = re.findall(r"^-- NEEDS +from ratelimit/common.lua: (.*)$", header, re.MULTILINE)
    declared = {name.strip() for name in needs.split(",")}
    used = {name for name in _defined_by_common() if re.search(rf"\b{name}\b", body)}
    assert used == declared


def test_a_call_includes_the_clock_the_library_then_its_algorithms_fragments() -> None:
    policies = PolicySet([SlidingCounter(3), TokenBucket(2, 1)])
    source = decide_script(policies).source
    assert source.startswith(CLOCK + "\n" + COMMON)
    token, counter = (Script(algorithm_of(p).fragment).source for p in reversed(policies))
    assert source.index(token) < source.index(counter) < source.index("local cost")
    assert Script(algorithm_of(LeakyBucket(1, 1)).fragment).source not in source


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: a.policy.name)
def test_each_algorithm_says_how_it_is_leased_and_its_lease_fragment_registers_that(
    algorithm: Algorithm,
) -> None:
    how = algorithm.lease
    if isinstance(how, NotLeased):  # the limiter refuses it, saying why
        with pytest.raises(ValueError, match=re.escape(how.reason)):
            RateLimiter(_smallest(algorithm), lease=Leasing())
        with pytest.raises(ValueError, match="cannot be leased"):
            lease_script(PolicySet([_smallest(algorithm)]))
        return
    source = Script(how.fragment).source
    header = _header(source)
    body = source[len(header) :]
    assert re.findall(r"^leasing\[(\d+)\] = ", body, re.MULTILINE) == [str(algorithm.kind)]
    assert f"REGISTERS   leasing[{algorithm.kind}]" in header
    # A bucket's lease fragment charges (its slots); a window's gives the window's terms.
    assert ("charge = function" in body) is isinstance(how, BucketLease)
    assert ("terms = " in body) is isinstance(how, WindowLease)
    # It uses nothing from the libraries that its header does not name.
    needs = _needs(header)
    for library, names in (("ratelimit/common.lua", _defined_by(COMMON)),
                           ("ratelimit/leasing.lua", _defined_by(LEASING))):  # fmt: skip
        used = {name for name in names if re.search(rf"\b{name}\b", body)}
        assert used == needs.get(library, set()), library


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: a.policy.name)
def test_each_algorithms_settle_fragment_registers_its_kind_and_says_its_rule(
    algorithm: Algorithm,
) -> None:
    source = Script(algorithm.settle_fragment).source
    header = _header(source)
    body = source[len(header) :]
    assert re.findall(r"^settling\[(\d+)\] = ", body, re.MULTILINE) == [str(algorithm.kind)]
    assert f"REGISTERS   settling[{algorithm.kind}]" in header
    assert "-- RULE" in header  # the settle rule, in words (docs/ratelimit.md's table)
    assert f"string_state = {str(algorithm.string_state).lower()}" in body
    assert algorithm.settle is getattr(settle_model, algorithm.policy.name)
    needs = _needs(header)
    for library, names in (("ratelimit/common.lua", _defined_by(COMMON)),
                           ("ratelimit/settling.lua", _defined_by(SETTLING))):  # fmt: skip
        used = {name for name in names if re.search(rf"\b{name}\b", body)}
        assert used == needs.get(library, set()), library


def test_the_leasing_library_knows_no_algorithm() -> None:
    # Which kinds can be leased is the table's and the lease fragments' to say.
    assert not re.search(r"(algorithms|leasing)\[\d", LEASING)
    assert "algorithms" not in LEASING.split("local leasing", 1)[1]


def test_a_lease_call_includes_the_lease_fragments_of_its_algorithms() -> None:
    policies = PolicySet([SlidingCounter(3), TokenBucket(2, 1)])
    source = lease_script(policies).source
    token, counter = (Script(algorithm_of(p).leased().fragment).source for p in reversed(policies))
    assert source.index(LEASING) < source.index(token) < source.index(counter)
    assert source.index(counter) < source.index("local now, grace_ms")
    assert Script(lease_model.leaky_bucket.fragment).source not in source


def test_an_algorithm_that_does_not_say_how_it_is_leased_is_refused() -> None:
    with pytest.raises(TypeError, match="lease"):
        Algorithm(6, TokenBucket, model.token_bucket, "ratelimit/token_bucket")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="must say whether and how its quota is leased"):
        Algorithm(
            6, TokenBucket, model.token_bucket, "ratelimit/t", lease=None,  # type: ignore[arg-type]
            settle=settle_model.token_bucket,
        )  # fmt: skip
    # lease.lua keeps every policy's state in one string: a key of one's own is not leased.
    with pytest.raises(ValueError, match="cannot be leased"):
        Algorithm(
            6, SlidingLog, model.sliding_log, "ratelimit/sliding_log", string_state=False,
            lease=lease_model.fixed_window, settle=settle_model.sliding_log,
        )  # fmt: skip


def test_leasing_follows_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    # An entry that says "not leased" is refused by both limiters, for its reason.
    entry = algorithm_of(FixedWindow(3, 1.0))
    refused = dataclasses.replace(entry, lease=NotLeased("not in this test"))
    monkeypatch.setitem(algorithms._BY_CLASS, FixedWindow, refused)
    for limiter in (RateLimiter, SyncRateLimiter):
        with pytest.raises(ValueError, match="FixedWindow cannot be leased: not in this test"):
            limiter(FixedWindow(3, 1.0), lease=Leasing())
    assert RateLimiter(FixedWindow(3, 1.0)).lease is None  # unleased, it decides as before


def _smallest(algorithm: Algorithm) -> Policy:
    hints = typing.get_type_hints(algorithm.policy)
    fields = [f.name for f in dataclasses.fields(algorithm.policy) if f.name != "on_error"]
    values: list[Any] = [1.0 if hints[name] is float else 1 for name in fields]
    return algorithm.policy(*values)
