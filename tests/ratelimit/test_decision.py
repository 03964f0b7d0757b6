"""Decisions from the backend's reply: the limiter's shortcut agrees with the general path."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from headway.ratelimit.decision import decision_from, decision_from_reply
from headway.ratelimit.model import Verdict
from headway.ratelimit.policies import Policy, PolicySet
from tests.ratelimit.strategies import policy_sets

# One policy's part of ``rl_decide.lua``'s reply: ok, remaining, reset_us, retry_us.
parts = st.tuples(
    st.integers(0, 1), st.integers(0, 10**9), st.integers(0, 10**12), st.integers(0, 10**12)
)


@given(policy_sets, st.data())
def test_a_reply_decides_as_its_verdict_does(policies: list[Policy], data: st.DataObject) -> None:
    chosen = PolicySet(policies)
    drawn = [data.draw(parts) for _ in chosen]
    allowed = int(all(ok for ok, *_ in drawn))  # admitted only if every policy admits
    reply = [allowed, *(value for part in drawn for value in part)]
    # One policy takes the shortcut (no Verdict), several the general path: same Decision.
    expected = decision_from(Verdict.from_reply(reply), chosen)
    assert decision_from_reply(reply, chosen) == expected
    assert expected.allowed is (allowed == 1)
    assert expected.retry_after == 0.0 or not expected.allowed
