"""The algorithm table agrees with the policies and with the Lua fragments' contract headers."""

from __future__ import annotations

import re
import typing

import pytest

from headway import LeakyBucket, SlidingCounter, TokenBucket
from headway._redis.scripts import Script
from headway.ratelimit.algorithms import ALGORITHMS, Algorithm, PolicySet, algorithm_of
from headway.ratelimit.backends.redis_scripts import decide_script
from headway.ratelimit.policies import Policy

COMMON = Script("ratelimit/common").source
CLOCK = Script("clock").source


def _header(source: str) -> str:
    return "".join(line + "\n" for line in source.splitlines() if line.startswith("--"))


def _defined_by_common() -> set[str]:
    """What the library script says it defines, checked against what it does define."""
    header = _header(COMMON).split("DEFINES", 1)[1]
    listed = set(re.findall(r"^--   (\w+)", header, re.MULTILINE))
    defined = set(re.findall(r"^local function (\w+)", COMMON, re.MULTILINE))
    defined |= set(re.findall(r"^local (\w+) = ", COMMON, re.MULTILINE))
    assert listed == defined
    return listed


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
