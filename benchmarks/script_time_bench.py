"""Redis server time per rate-limit decision: headway's scripts beside limits and throttled-py.

    uv run --group bench python benchmarks/script_time_bench.py [--rounds 5] [--calls 2000]
    uv run --group bench python benchmarks/script_time_bench.py --instructions   # callgrind
    uv run --group bench python benchmarks/script_time_bench.py --before main  # + rows of main

What caps a fleet that shares one Redis is the server's CPU per decision, not the
client's latency. This benchmark starts its own throw-away ``redis-server`` on a free
loopback port (stopped by PID at the end) and, for each contender, makes ``--calls``
sequential decisions on one key after ``CONFIG RESETSTAT``, then reads ``INFO
commandstats``: the ``usec`` of the script call per decision (FCALL for headway, EVALSHA
for the peers: the script's time inside Redis,
its own commands included) and of **all** commands the client sent (a peer that sends a
plain command beside its script pays for both). Commands run inside scripts appear in
commandstats too; a short ``MONITOR`` sample of each contender tells which were sent by
the client, so they are counted once. Scenarios: ``hot`` (a generous quota: every call
admitted) and ``rejected`` (10 per hour: nearly every call refused). Rounds are
interleaved (every contender once per round, every other round in reverse order);
medians over rounds. ``--before REV`` adds the headway rows of an earlier revision
(``_baseline.py``), each measured next to its current row.

Beside them, the server main thread's CPU per decision (``INFO cpu``:
``used_cpu_user_main_thread`` + ``used_cpu_sys_main_thread``, Redis 7, read before and
after the decisions): everything the server does for a call, reading the request and
writing the reply included, which commandstats leaves out (issue 29). Its ratio to the
best peer is also given as the median of per-round ratios (a round's contenders share
the load of the moment).

``--instructions`` counts instead the instructions the server runs per decision, under
valgrind's callgrind (``_callgrind_redis.py``): every command the client sent, with the
server's own request handling; deterministic, where the timings on a busy machine move
by ±20 %.

The floors are functions called with the arguments of headway's one-policy call:
``return 1``, ``TIME`` alone, ``TIME`` + ``GET``, ``TIME`` + ``GET`` + ``SET KEEPTTL``
(a fixed window's commands) or ``SET PX``; a sliding log's admission (its five
commands, nothing else: the ``hot`` row is the one that means something); and ``TIME`` +
``ZCARD`` + a one-entry ``ZRANGE`` on a log of 10 entries (the least a sliding-log
refusal with its remaining and retry-after reads), with the newest entry's too (its
reset), and the same with both entries parsed and answered as ``decide_one.lua`` does.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from _baseline import baseline, same_policy
from _callgrind_redis import counted_redis
from ratelimit_bench import (  # the same policies as the decision benchmark
    fixed_window,
    leaky_bucket,
    per_hour,
    per_minute,
    sliding_counter,
    sliding_log,
    token_bucket,
)

from headway import (
    SyncRateLimiter,
    SyncRedisRateLimitBackend,
)
from headway._redis.scripts import Script
from headway._redis.sync_wire import SyncWire
from headway.ratelimit.policies import Policy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests
from tests.servers import private_redis

Decide = Callable[[str], bool]
#: Builds a contender for a scenario on a server URL: its decide function and a closer.
Factory = Callable[[bool, str], tuple[Decide, Callable[[], None]]]

HIGH = 100_000  # per second: the "hot" quota, never reached here
LOW = 10  # per hour: the "rejected" quota
SCENARIOS = {"hot": True, "rejected": False}


def _nothing() -> None:
    return None


# --- floors ---------------------------------------------------------------------------


def _floor(body: str, log: bool = False, window: bool = False) -> Factory:
    """A script of ``body`` called as headway calls its scripts (a Redis function), with
    the keys and arguments of a one-policy decision; ``log``: its key a sliding log of
    10 entries (what the ``rejected`` scenario's holds); ``window``: the arguments of the
    scenario's fixed window (else a fixed set)."""

    def factory(generous: bool, url: str) -> tuple[Decide, Callable[[], None]]:
        client = redis.Redis.from_url(url)
        wire, script = SyncWire(client), Script.from_source("floor", body)
        if log:
            stamps = {f"{10**15 + i}:{i}": 10**15 + i for i in range(LOW)}
            client.zadd("headway:{k}:rl", stamps)
        # decide_one.lua's arguments: a, b, cost.
        args: list[int | str] = [10, 1000, 1]
        if window:
            args = [1_000_000, HIGH, 1] if generous else [3600 * 10**6, LOW, 1]

        def decide(key: str) -> bool:
            return bool(wire.call(script, ["headway:{" + key + "}:rl"], args))

        return decide, client.close

    return factory


GET = "redis.call('TIME') local v = redis.call('GET', KEYS[1]) "
FLAT_WINDOW = """
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local a, b, cost = ARGV[1] + 0, ARGV[2] + 0, ARGV[3] + 0
local index = math.floor(now / a)
if index * a > now then index = index - 1 elseif (index + 1) * a <= now then index = index + 1 end
local count = 0
local state = redis.call('GET', KEYS[1])
if state then
  local w, c = string.match(state, '^(%d+):(%d+)$')
  if w + 0 == index then count = c + 0 end
end
if count + cost > b then return 0 end
local value = string.format('%d:%d', index, count + cost)
if count > 0 then
  redis.call('SET', KEYS[1], value, 'KEEPTTL')
else
  redis.call('SET', KEYS[1], value, 'PX', math.ceil(((index + 1) * a - now) / 1000))
end
return 1
"""
LOG_REFUSAL = """
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local a, b, cost = ARGV[1] + 0, ARGV[2] + 0, ARGV[3] + 0
local count = redis.call('ZCARD', KEYS[1])
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
local first = string.sub(oldest, 1, string.find(oldest, ':', 1, true) - 1) + 0
local newest = redis.call('ZRANGE', KEYS[1], -1, -1)[1]
local last = string.sub(newest, 1, string.find(newest, ':', 1, true) - 1) + 0
return {0, 0, 0, last + a - now, first + a - now}
"""
FLOORS: dict[str, Factory] = {
    "floor: return 1": _floor("return 1"),
    "floor: TIME": _floor("redis.call('TIME') return 1"),
    "floor: TIME+GET": _floor(GET + "return 1"),
    "floor: TIME+GET+SET KEEPTTL": _floor(
        GET + "redis.call('SET', KEYS[1], '1:2', 'KEEPTTL') return 1"
    ),
    "floor: TIME+GET+SET PX": _floor(
        GET + "redis.call('SET', KEYS[1], '1:2', 'PX', 1000) return 1"
    ),
    # A sliding log's admission: its commands alone (members as numbers, no reply).
    "floor: TIME+ZREMRANGEBYSCORE+ZCARD+ZADD+PTTL": _floor(
        "local t = redis.call('TIME') local now = t[1] * 1000000 + t[2] "
        "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 1000000) "
        "redis.call('ZCARD', KEYS[1]) redis.call('ZADD', KEYS[1], now, now) "
        "redis.call('PTTL', KEYS[1]) return 1"
    ),
    # The least a sliding-log refusal reporting remaining and retry-after reads.
    "floor: TIME+ZCARD+ZRANGE": _floor(
        "redis.call('TIME') redis.call('ZCARD', KEYS[1]) "
        "redis.call('ZRANGE', KEYS[1], 0, 0) return 1",
        log=True,
    ),
    # ... and with the reset too (the newest entry): a full log's refusal as headway's.
    "floor: TIME+ZCARD+ZRANGE+ZRANGE": _floor(
        "redis.call('TIME') redis.call('ZCARD', KEYS[1]) "
        "redis.call('ZRANGE', KEYS[1], 0, 0) redis.call('ZRANGE', KEYS[1], -1, -1) return 1",
        log=True,
    ),
    # ... and its two entries parsed and answered as decide_one.lua answers a log's
    # refusal (a list: its retry and reset differ), in one flat function.
    "floor: full log refused, answered": _floor(LOG_REFUSAL, log=True),
    # An aligned fixed window on the server's clock, computed and charged (refused
    # requests not), answering nothing: one script, no fragments, a reply of one integer.
    "floor: fixed window, no answer": _floor(FLAT_WINDOW, window=True),
}


# --- headway --------------------------------------------------------------------------


def _headway(*make: Callable[[bool], Policy], lib: Any = None) -> Factory:
    """A ``SyncRateLimiter`` of ``make``'s policies; ``lib``: an earlier headway's
    (``_baseline``) instead of this one."""

    def factory(generous: bool, url: str) -> tuple[Decide, Callable[[], None]]:
        policies = [m(generous) for m in make]
        if lib is None:
            backend = SyncRedisRateLimitBackend.from_url(url)
            limiter = SyncRateLimiter(*policies, backend=backend)
        else:
            backend = lib.SyncRedisRateLimitBackend.from_url(url)
            policies = [same_policy(lib, p) for p in policies]
            limiter = lib.SyncRateLimiter(*policies, backend=backend)

        def decide(key: str) -> bool:
            return limiter.hit(key).allowed

        return decide, backend.client.close

    return factory


# --- peers ----------------------------------------------------------------------------


def _limits(strategy: str, stats: bool = False) -> Factory:
    """limits' ``hit``; with ``stats``, then ``get_window_stats`` (remaining and reset)."""

    def factory(generous: bool, url: str) -> tuple[Decide, Callable[[], None]]:
        from limits import RateLimitItemPerHour, RateLimitItemPerSecond, strategies
        from limits.storage import RedisStorage

        storage = RedisStorage(url)
        limiter = getattr(strategies, strategy)(storage)
        item = RateLimitItemPerSecond(HIGH) if generous else RateLimitItemPerHour(LOW)

        def decide(key: str) -> bool:
            allowed = bool(limiter.hit(item, key))
            if stats:
                limiter.get_window_stats(item, key)
            return allowed

        return decide, _nothing

    return factory


def _throttled(using: str) -> Factory:
    def factory(generous: bool, url: str) -> tuple[Decide, Callable[[], None]]:
        from throttled import RedisStore, Throttled, per_hour, per_sec

        store = RedisStore(server=url)
        quota = per_sec(HIGH, burst=HIGH) if generous else per_hour(LOW, burst=LOW)
        throttle = Throttled(using=using, quota=quota, store=store, timeout=-1)

        def decide(key: str) -> bool:
            return not throttle.limit(key).limited

        return decide, _nothing

    return factory


#: Each headway row's policies, and the peers it is held to (the best of them).
ROWS: dict[str, tuple[tuple[Callable[[bool], Policy], ...], tuple[str, ...]]] = {
    "TokenBucket": ((token_bucket,), ("throttled-py token_bucket", "throttled-py gcra")),
    "LeakyBucket": ((leaky_bucket,), ("throttled-py leaking_bucket",)),
    # throttled-py's fixed_window is no script: one INCRBY on a key per window named by
    # the client's clock (listed, not held to: headway reads the server's).
    "FixedWindow": ((fixed_window,), ("limits fixed-window",)),
    "SlidingLog": ((sliding_log,), ("limits moving-window",)),
    "SlidingCounter": (
        (sliding_counter,),
        ("limits sliding-window-counter", "throttled-py sliding_window"),
    ),
    "3 policies": ((token_bucket, per_minute, per_hour), ()),
}
#: Each headway row's factory and the peers it is held to (``--before`` adds rows).
HEADWAY: dict[str, tuple[Factory, tuple[str, ...]]] = {
    f"headway {name}": (_headway(*make), peers) for name, (make, peers) in ROWS.items()
}
PEERS: dict[str, Factory] = {
    "limits fixed-window": _limits("FixedWindowRateLimiter"),
    "limits moving-window": _limits("MovingWindowRateLimiter"),
    "limits sliding-window-counter": _limits("SlidingWindowCounterRateLimiter"),
    # What a headway decision answers too (remaining, reset), which limits' hit does not:
    # listed, not held to.
    "limits fixed-window + stats": _limits("FixedWindowRateLimiter", stats=True),
    "limits moving-window + stats": _limits("MovingWindowRateLimiter", stats=True),
    "throttled-py token_bucket": _throttled("token_bucket"),
    "throttled-py gcra": _throttled("gcra"),
    "throttled-py leaking_bucket": _throttled("leaking_bucket"),
    "throttled-py fixed_window": _throttled("fixed_window"),
    "throttled-py sliding_window": _throttled("sliding_window"),
}
CONTENDERS: dict[str, Factory] = {**FLOORS, **{n: f for n, (f, _) in HEADWAY.items()}, **PEERS}


# --- measuring ------------------------------------------------------------------------

SCRIPT_CALLS = ("fcall", "evalsha", "eval")


def _stats(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """``INFO commandstats`` as command -> (calls, usec), without the benchmark's own."""
    stats = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): (s["calls"], s["usec"])
        for name, s in stats.items()
        if not name.startswith(("cmdstat_info", "cmdstat_config", "cmdstat_flushdb"))
    }


def sent_by_client(decide: Decide, key: str, url: str, calls: int = 20) -> dict[str, float]:
    """Per command name, the share of its calls the client sent (MONITOR: the rest ran in Lua)."""
    client = redis.Redis.from_url(url)
    seen: Counter[tuple[str, bool]] = Counter()
    ready = threading.Event()

    def listen() -> None:
        with client.monitor() as monitor:  # type: ignore[no-untyped-call]
            ready.set()
            for entry in monitor.listen():
                words = entry["command"].split()
                if words[:2] == ["ECHO", "end-of-sample"]:
                    return
                seen[(words[0].lower(), entry["client_type"] == "lua")] += 1

    thread = threading.Thread(target=listen)
    thread.start()
    ready.wait(5)
    # MONITOR is attached once its connection answered; a PING through it would be consumed.
    redis.Redis.from_url(url).ping()
    for _ in range(calls):
        decide(key)
    redis.Redis.from_url(url).echo("end-of-sample")
    thread.join(10)
    names = {name for name, _ in seen}
    return {n: seen[(n, False)] / (seen[(n, False)] + seen[(n, True)]) for n in names}


@dataclass
class Sample:
    script_us: float  # script (FCALL, EVALSHA) usec per decision
    all_us: float  # every command the client sent, per decision
    admitted: float
    cpu_us: float  # the server main thread's CPU (user + sys) per decision
    user_us: float  # ... its user part alone (the kernel's share moves the most)


#: ``INFO cpu``'s fields for the main thread alone (Redis 7): I/O threads and the
#: background ones (lazy free, fsync) are left out, and nothing else runs on this server.
MAIN_THREAD_CPU = ("used_cpu_sys_main_thread", "used_cpu_user_main_thread")


def main_thread_cpu_us(client: redis.Redis) -> tuple[float, float]:
    """The server main thread's CPU time so far (user + sys, and user alone), in µs."""
    cpu = client.info("cpu")
    user = float(cpu["used_cpu_user_main_thread"]) * 1e6
    return sum(float(cpu[field]) for field in MAIN_THREAD_CPU) * 1e6, user


def measure(name: str, generous: bool, url: str, calls: int) -> Sample:
    admin = redis.Redis.from_url(url)
    admin.flushdb()
    decide, close = CONTENDERS[name](generous, url)
    try:
        for _ in range(LOW + 5):  # connections, scripts loaded, the rejected key's quota used
            decide("k")
        shares = sent_by_client(decide, "k", url)
        admin.config_resetstat()
        # Everything the main thread does for a call: reading it, the command, the reply.
        # One INFO before and one after are in it too (~0.01 µs per decision at 2,000).
        cpu_before = main_thread_cpu_us(admin)
        admitted = sum(decide("k") for _ in range(calls))
        cpu_after = main_thread_cpu_us(admin)
        stats = _stats(admin)
    finally:
        close()
        admin.flushdb()
        admin.close()
    script = sum(stats.get(c, (0, 0))[1] for c in SCRIPT_CALLS)
    everything = sum(usec * shares.get(n, 0.0) for n, (_, usec) in stats.items())
    cpu, user = (after - before for after, before in zip(cpu_after, cpu_before, strict=True))
    return Sample(script / calls, everything / calls, admitted / calls, cpu / calls, user / calls)


def _median(samples: list[Sample], attribute: str) -> float:
    return statistics.median(float(getattr(s, attribute)) for s in samples)


def report(results: dict[tuple[str, str], list[Sample]], rounds: int, calls: int) -> None:
    print(f"\n{rounds} round(s) x {calls} sequential decisions; usec per decision, medians\n")
    for scenario in SCENARIOS:
        print(f"### {scenario}\n")
        print("| contender | script µs | all commands µs | main thread CPU µs | user | admitted |")
        print("|---|--:|--:|--:|--:|--:|")
        for name in CONTENDERS:
            s = results[(name, scenario)]
            print(
                f"| {name} | {_median(s, 'script_us'):.2f} | {_median(s, 'all_us'):.2f} "
                f"| {_median(s, 'cpu_us'):.2f} | {_median(s, 'user_us'):.2f} "
                f"| {_median(s, 'admitted'):.0%} |"
            )
        print("\n| headway | µs (all) | best peer | µs (all) | headway / peer |")
        print("|---|--:|---|--:|--:|")
        for name, (_, peers) in HEADWAY.items():
            own = _median(results[(name, scenario)], "all_us")
            peers = tuple(p for p in peers if (p, scenario) in results)
            if not peers:
                print(f"| {name} | {own:.2f} | — | | |")
                continue
            best = min(peers, key=lambda p: _median(results[(p, scenario)], "all_us"))
            theirs = _median(results[(best, scenario)], "all_us")
            print(f"| {name} | {own:.2f} | {best} | {theirs:.2f} | {own / theirs:.2f} |")
        print()
        report_cpu(results, scenario)
        report_before(results, scenario)


def report_cpu(results: dict[tuple[str, str], list[Sample]], scenario: str) -> None:
    """Main-thread CPU per decision against the best peer (the lowest median), with the
    median of the per-round ratios: each round measured both within seconds of each other,
    so the load of the moment weighs on both."""
    print("| headway | CPU µs | best peer | CPU µs | ratio of medians | median ratio |")
    print("|---|--:|---|--:|--:|--:|")
    for name, (_, peers) in HEADWAY.items():
        mine = results[(name, scenario)]
        own = _median(mine, "cpu_us")
        peers = tuple(p for p in peers if (p, scenario) in results)
        if not peers:
            print(f"| {name} | {own:.2f} | — | | | |")
            continue
        best = min(peers, key=lambda p: _median(results[(p, scenario)], "cpu_us"))
        theirs = results[(best, scenario)]
        per_round = statistics.median(
            m.cpu_us / t.cpu_us for m, t in zip(mine, theirs, strict=True)
        )
        print(
            f"| {name} | {own:.2f} | {best} | {_median(theirs, 'cpu_us'):.2f} "
            f"| {own / _median(theirs, 'cpu_us'):.2f} | {per_round:.2f} |"
        )
    print()


def report_before(results: dict[tuple[str, str], list[Sample]], scenario: str) -> None:
    """With ``--before``: each headway row's CPU against its earlier self (per-round ratios)."""
    pairs = [n for n in ROWS if (f"before {n}", scenario) in results]
    if not pairs:
        return
    print("| algorithm | before CPU µs | after CPU µs | median after / before | user, all rounds |")
    print("|---|--:|--:|--:|--:|")
    for name in pairs:
        old, new = results[(f"before {name}", scenario)], results[(f"headway {name}", scenario)]
        ratio = statistics.median(n.cpu_us / o.cpu_us for n, o in zip(new, old, strict=True))
        # Linux splits a thread's time into user and sys by sampling ticks: a short sample
        # may show no user time at all, so that part is compared over the whole run.
        user = sum(n.user_us for n in new) / sum(o.user_us for o in old)
        print(
            f"| {name} | {_median(old, 'cpu_us'):.2f} | {_median(new, 'cpu_us'):.2f} "
            f"| {ratio:.3f} | {user:.3f} |"
        )
    print()


def _repeat(decide: Decide, calls: int) -> None:
    for _ in range(calls):
        decide("k")


def count_instructions(calls: int) -> dict[tuple[str, str], float]:
    """Server instructions per decision of every contender (one pass: counts do not vary)."""
    counts: dict[tuple[str, str], float] = {}
    with counted_redis() as server:
        admin = redis.Redis.from_url(server.url)
        for scenario, generous in SCENARIOS.items():
            for name in CONTENDERS:
                admin.flushdb()
                decide, close = CONTENDERS[name](generous, server.url)
                for _ in range(LOW + 5):
                    decide("k")
                total = server.instructions(functools.partial(_repeat, decide, calls))
                close()
                counts[(name, scenario)] = total / calls
        admin.close()
    return counts


def report_instructions(counts: dict[tuple[str, str], float], calls: int) -> None:
    print(f"\nredis-server instructions per decision (callgrind, {calls} decisions each)\n")
    for scenario in SCENARIOS:
        print(f"### {scenario}\n")
        print("| contender | instructions |")
        print("|---|--:|")
        for name in CONTENDERS:
            print(f"| {name} | {counts[(name, scenario)]:,.0f} |")
        print("\n| headway | instructions | best peer | instructions | headway / peer |")
        print("|---|--:|---|--:|--:|")
        for name, (_, peers) in HEADWAY.items():
            own = counts[(name, scenario)]
            peers = tuple(p for p in peers if (p, scenario) in counts)
            if not peers:
                print(f"| {name} | {own:,.0f} | — | | |")
                continue
            best = min(peers, key=lambda p: counts[(p, scenario)])
            theirs = counts[(best, scenario)]
            print(f"| {name} | {own:,.0f} | {best} | {theirs:,.0f} | {own / theirs:.2f} |")
        print()


def _picked(word: str, name: str) -> bool:
    """Whether ``--only``'s ``word`` picks ``name``: a part of it, or all of it (``word$``)."""
    return name == word[:-1] if word.endswith("$") else word in name


def add_before(rev: str) -> None:
    """Rows ``before <name>`` of headway at ``rev`` (``_baseline``), held to the same peers."""
    lib = baseline(rev)
    contenders = dict(CONTENDERS)
    CONTENDERS.clear()
    for name, factory in contenders.items():
        CONTENDERS[name] = factory
        if name.startswith("headway "):  # measured next to each other (and the peers)
            row = name.removeprefix("headway ")
            make, peers = ROWS[row]
            CONTENDERS[f"before {row}"] = _headway(*make, lib=lib)
            HEADWAY[f"before {row}"] = (CONTENDERS[f"before {row}"], peers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument(
        "--only", nargs="*", default=None, help="contenders whose name has this (with $: is this)"
    )
    parser.add_argument(
        "--instructions", action="store_true", help="count the server's instructions (callgrind)"
    )
    parser.add_argument(
        "--before", metavar="REV", help="also the headway rows at git REV, interleaved"
    )
    args = parser.parse_args()
    if args.before:
        add_before(args.before)
    if args.only:
        keep = {n for n in CONTENDERS if any(_picked(word, n) for word in args.only)}
        for name in list(CONTENDERS):
            if name not in keep:
                del CONTENDERS[name]
        for name in list(HEADWAY):
            if name not in keep:
                del HEADWAY[name]
    if args.instructions:
        report_instructions(count_instructions(min(args.calls, 500)), min(args.calls, 500))
        return
    results: dict[tuple[str, str], list[Sample]] = {}
    with private_redis() as url:
        for i in range(args.rounds):
            for scenario, generous in SCENARIOS.items():
                # Every other round in reverse: no contender always follows the same one.
                for name in list(CONTENDERS)[:: -1 if i % 2 else 1]:
                    sample = measure(name, generous, url, args.calls)
                    results.setdefault((name, scenario), []).append(sample)
    report(results, args.rounds, args.calls)


if __name__ == "__main__":
    main()
