"""Decisions from a reply, and the leased `admitted`, agree with the plain constructors."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headway import Decision, FixedWindow, PolicyDecision, Source
from headway.ratelimit.algorithms import PolicySet
from headway.ratelimit.decision import admitted, decision_from_reply
from headway.ratelimit.policies import Policy
from tests.ratelimit.strategies import policy_sets

# One policy's part of ``ratelimit/decide.lua``'s reply: ok, remaining, reset_us, retry_us.
parts = st.tuples(
    st.integers(0, 1), st.integers(0, 10**9), st.integers(0, 10**12), st.integers(0, 10**12)
)


def built_plainly(reply: list[int], policies: PolicySet) -> Decision:
    """The documented decision, through the dataclasses' own constructors."""
    each = tuple(
        PolicyDecision(p, reply[i] == 1, reply[i + 1], reply[i + 2] / 1e6, reply[i + 3] / 1e6)
        for p, i in zip(policies, range(1, len(reply), 4), strict=True)
    )
    allowed = reply[0] == 1
    if allowed:  # the fewest units left (then the longest reset) describes an admission
        chosen = min(each, key=lambda d: (d.remaining, -d.reset_after))
    else:  # the longest wait describes a rejection
        chosen = max((d for d in each if not d.allowed), key=lambda d: d.retry_after)
    retry = 0.0 if allowed else chosen.retry_after
    return Decision(
        allowed,
        chosen.policy.limit,
        chosen.remaining,
        chosen.reset_after,
        retry,
        chosen.policy,
        Source.BACKEND,
        each,
    )


@given(policy_sets, st.data())
def test_a_reply_decides_as_documented(policies: list[Policy], data: st.DataObject) -> None:
    chosen = PolicySet(policies)
    drawn = [data.draw(parts) for _ in chosen]
    allowed = int(all(ok for ok, *_ in drawn))  # admitted only if every policy admits
    reply = [allowed, *(value for part in drawn for value in part)]
    # One policy takes the shortcut (no loop), several the general path: same Decision.
    expected = built_plainly(reply, chosen)
    assert decision_from_reply(reply, chosen) == expected
    assert expected.allowed is (allowed == 1)
    assert expected.retry_after == 0.0 or not expected.allowed


@given(policy_sets, st.integers(0, 10**9), st.integers(0, 10**12))
def test_a_leased_admission_is_the_documented_decision(
    policies: list[Policy], remaining: int, reset_us: int
) -> None:
    policy = policies[0]
    fast = admitted(policy, remaining, reset_us / 1e6)
    plain = built_plainly([1, 1, remaining, reset_us, 0], PolicySet([policy]))
    assert fast == plain
    assert type(fast) is Decision
    assert type(fast.policies[0]) is PolicyDecision
    assert repr(fast) == repr(plain)
    assert hash(fast) == hash(plain)


def test_fast_built_decisions_stay_frozen() -> None:
    policy = PolicySet([FixedWindow(10, 1.0)])[0]
    built = (admitted(policy, 3, 0.5), decision_from_reply([1, 1, 3, 500_000, 0], [policy]))
    for decision in built:
        with pytest.raises(dataclasses.FrozenInstanceError):
            decision.remaining = 4  # type: ignore[misc]
        with pytest.raises(dataclasses.FrozenInstanceError):
            decision.policies[0].remaining = 4  # type: ignore[misc]
