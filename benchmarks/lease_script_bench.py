"""Redis server instructions per lease call (``lua/ratelimit/lease.lua``), under callgrind.

    PYTHONPATH=. uv run --group bench python benchmarks/lease_script_bench.py [--calls 300]

A throw-away ``redis-server`` under valgrind's callgrind (``_callgrind_redis.py``):
the server's whole work per call (request parsing, the script, its commands, the
reply), deterministic where timings on a shared machine move by ±20 %. Each row makes
``--calls`` lease calls of cost 1 on one key, back to back through
``SyncRedisRateLimitBackend.lease`` (default ``Leasing()``: 128 units a call): giving
nothing back (the leased path's call once a lease is spent), or giving 5 units back
(a lease replaced before it was spent); then a refused lease (quota spent).
"""

from __future__ import annotations

import argparse
import functools

from _callgrind_redis import counted_redis

from headway import (
    FixedWindow,
    LeakyBucket,
    Leasing,
    SlidingCounter,
    SyncRedisRateLimitBackend,
    TokenBucket,
)
from headway.ratelimit.algorithms import PolicySet
from headway.ratelimit.policies import Policy

LEASING = Leasing()
SETS: dict[str, list[Policy]] = {
    "FixedWindow": [FixedWindow(10**7, 60.0)],
    "TokenBucket": [TokenBucket(10**6, 10**6, 60.0)],
    "LeakyBucket": [LeakyBucket(10**6, 10**6, 60.0)],
    "SlidingCounter": [SlidingCounter(10**7, 60.0)],
    "FixedWindow + TokenBucket": [FixedWindow(10**7, 60.0), TokenBucket(10**6, 10**6, 60.0)],
}
REFUSED: dict[str, list[Policy]] = {
    "FixedWindow": [FixedWindow(1, 3600.0)],
    "TokenBucket": [TokenBucket(1, 1, 3600.0)],
}


def _leases(backend: SyncRedisRateLimitBackend, ps: PolicySet, calls: int, back: int) -> None:
    reply = backend.lease("hot", ps, 1, LEASING)
    for _ in range(calls):
        marks = [reply[7 + 7 * i] for i in range(len(ps))]
        reply = backend.lease("hot", ps, 1, LEASING, (back, marks) if back else (0, []))
        assert reply[0] > 0, reply


def _refused(backend: SyncRedisRateLimitBackend, ps: PolicySet, calls: int) -> None:
    for _ in range(calls):
        assert backend.lease("spent", ps, 1, LEASING)[0] == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    calls = parser.parse_args().calls
    print(f"\nredis-server instructions per lease call (callgrind, {calls} calls each)\n")
    print("| policies | nothing back | 5 units back |")
    print("|---|--:|--:|")
    with counted_redis() as server:
        backend = SyncRedisRateLimitBackend.from_url(server.url)
        for name, policies in SETS.items():
            ps, row = PolicySet(policies), []
            _leases(backend, ps, 3, 5)  # the script loaded, the key made
            for back in (0, 5):
                backend.reset("hot", ps)
                count = server.instructions(functools.partial(_leases, backend, ps, calls, back))
                row.append(f"{count / calls:,.0f}")
            print(f"| {name} | {' | '.join(row)} |")
        print("\n| policy, quota spent | refused |\n|---|--:|")
        for name, policies in REFUSED.items():
            ps = PolicySet(policies)
            backend.lease("spent", ps, 1, LEASING)
            count = server.instructions(functools.partial(_refused, backend, ps, calls))
            print(f"| {name} | {count / calls:,.0f} |")


if __name__ == "__main__":
    main()
