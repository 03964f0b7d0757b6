import math
import os
import threading
import warnings

import pytest

from headway.lock.lease import Lease, check_timeout, check_ttl, new_token


def test_tokens_are_128_bit_and_unique() -> None:
    tokens = {new_token() for _ in range(10_000)}
    assert len(tokens) == 10_000
    assert all(len(t) == 32 for t in tokens)


def test_threads_never_share_a_token() -> None:
    # Tokens are read ahead in batches; many threads drain and refill the batch at once.
    per_thread: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def take(into: list[str]) -> None:
        start.wait()
        into.extend(new_token() for _ in range(5_000))

    threads = [threading.Thread(target=take, args=(into,)) for into in per_thread]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({t for tokens in per_thread for t in tokens}) == 8 * 5_000


def test_a_forked_child_never_repeats_its_parents_tokens() -> None:
    new_token()  # a batch is read ahead: the child must not inherit it
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: forking with threads
        pid = os.fork()
    if pid == 0:  # the child: send its tokens and leave at once
        os.write(write, "".join(new_token() for _ in range(100)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    parent = "".join(new_token() for _ in range(100))
    child_tokens = {child[i : i + 32] for i in range(0, len(child), 32)}
    assert len(child_tokens) == 100
    assert not child_tokens & {parent[i : i + 32] for i in range(0, len(parent), 32)}


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


def test_a_renewed_lease_keeps_its_identity_and_counts_from_the_send() -> None:
    lease = Lease("r", "t" * 32, 7, 100.0, 30.0)
    renewed = lease.renewed(1500, 200.0)
    assert renewed == Lease("r", "t" * 32, 7, 201.5, 1.5)
