import math

import pytest

from headway.lock._lease import Lease, check_timeout, check_ttl, new_token


def test_tokens_are_128_bit_and_unique() -> None:
    tokens = {new_token() for _ in range(10_000)}
    assert len(tokens) == 10_000
    assert all(len(t) == 32 for t in tokens)


@pytest.mark.parametrize("ttl", [0, -1, math.nan, math.inf, 10**9])
def test_bad_ttl_raises_value_error(ttl: float) -> None:
    with pytest.raises(ValueError, match="ttl"):
        check_ttl(ttl)


@pytest.mark.parametrize("timeout", [-0.1, math.nan, math.inf, 10**9])
def test_bad_timeout_raises_value_error(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout"):
        check_timeout(timeout)


@pytest.mark.parametrize("value", ["1", None, True])
def test_non_numbers_raise_type_error(value: object) -> None:
    with pytest.raises(TypeError):
        check_ttl(value)  # type: ignore[arg-type]


def test_ttl_is_whole_milliseconds_at_least_one() -> None:
    assert check_ttl(0.0001) == 1
    assert check_ttl(1.5) == 1500


def test_lease_is_frozen_and_reports_remaining() -> None:
    lease = Lease("r", "t", 1, deadline=10.0, ttl=5.0)
    assert lease.remaining(now=7.5) == 2.5
    with pytest.raises(AttributeError):
        lease.fence = 2  # type: ignore[misc]
