"""Lock benchmark: headway against redis-py, python-redis-lock and pottery, in one run.

    uv run python benchmarks/lock_bench.py [--quick] [--url redis://HOST:PORT/DB]

Without ``--url`` it starts a private redis-server on a free loopback port, so
the server counters (commands per cycle) see only this run's traffic and
nobody else's ``SCRIPT FLUSH`` reaches it. For every lock it measures:

1. uncontended acquire+release cycles: latency median / p99, cycles/s;
2. round trips per cycle (requests written by the client, counted by a
   connection subclass) and commands the server processed per cycle
   (``INFO stats`` delta; commands run inside scripts count too), and how many
   of those are script calls (FCALL, EVAL/EVALSHA);
3. contention: 8 workers (tasks for async locks, threads for sync ones) loop
   acquire -> tiny critical section -> release on one key for a fixed time;
   throughput, each worker's share of the grants, and mutual exclusion
   (a read-yield-write counter and a count of holders inside). With
   ``--think MS`` each worker also works MS milliseconds outside the lock
   between grants, as real workers do; without it a releasing worker comes
   straight back, which a lock without a queue hands to that same worker.

Rounds interleave the locks (alternating order) so a machine whose load
drifts skews them alike; latencies pool over rounds, rates take the median.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from _lock_many import MANY, many_keys
from _lock_phases import (
    Config,
    Result,
    Server,
    contended_async,
    contended_sync,
    uncontended_async,
    uncontended_sync,
)
from _lock_subjects import BASELINE, SUBJECTS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.servers import private_redis

FULL = Config(rounds=3, cycles=1000, counted=200, workers=8, seconds=1.5)
QUICK = Config(rounds=1, cycles=300, counted=100, workers=8, seconds=0.5)


# -- the run and the report ---------------------------------------------------------------


@contextmanager
def redis_url(url: str | None) -> Iterator[str]:
    """``url`` as given, or a private redis-server started for this run."""
    if url is not None:
        yield url
        return
    with private_redis(db=7) as private:
        yield private


def run(url: str, cfg: Config, private: bool, only: str) -> list[Result]:
    server = Server(url)
    results = [Result(s) for s in SUBJECTS if only in s.name or s.name in BASELINE.values()]
    for round_ in range(cfg.rounds):
        for result in results if round_ % 2 == 0 else results[::-1]:
            counting = server if round_ == 0 else None
            print(f"  round {round_ + 1}/{cfg.rounds}: {result.subject.name}", file=sys.stderr)
            contend = result.subject.contend
            if result.subject.is_async:
                asyncio.run(uncontended_async(result, url, cfg, counting))
                if contend:
                    asyncio.run(contended_async(result, url, cfg, server))
            else:
                if result.subject.calm:
                    uncontended_sync(result, url, cfg, counting)
                if contend:
                    contended_sync(result, url, cfg, server)
    if not private:
        print("note: shared server; commands/cycle include other clients' traffic")
    return results


def run_many(url: str, cfg: Config, workers: int = 64) -> dict[str, float]:
    """Median cycles/s of each ``MANY`` row, rounds interleaved like ``run``."""
    rates: dict[str, list[float]] = {name: [] for name in MANY}
    for round_ in range(cfg.rounds):
        for name in list(MANY) if round_ % 2 == 0 else list(MANY)[::-1]:
            print(f"  round {round_ + 1}/{cfg.rounds}: {name}, {workers} keys", file=sys.stderr)
            rates[name].append(asyncio.run(many_keys(url, name, workers, cfg.seconds)))
    return {name: statistics.median(r) for name, r in rates.items()}


def many_table(rates: dict[str, float], workers: int) -> str:
    """The many-keys table, in Markdown."""
    base = rates["headway async"]
    rows = [[name, f"{rate:.0f}", f"{rate / base:.2f}"] for name, rate in rates.items()]
    return f"Uncontended, {workers} async workers on {workers} keys, one client:\n\n" + _markdown(
        ["lock", "cycles/s", "x headway"], rows
    )


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _markdown(head: list[str], rows: list[list[str]]) -> str:
    lines = [head, ["---"] * len(head), *rows]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def tables(results: list[Result], workers: int) -> str:
    """The uncontended and the contended table, in Markdown."""
    base = {r.subject.name: r for r in results if r.subject.name in BASELINE.values()}
    calm, busy = [], []
    for r in results:
        b = base[BASELINE[r.subject.is_async]]
        if r.rates:  # else measured under contention only
            rate, b_rate = statistics.median(r.rates), statistics.median(b.rates)
            calm.append([
                r.subject.name,
                f"{statistics.median(r.latencies) * 1e6:.0f}",
                f"{_quantile(r.latencies, 0.99) * 1e6:.0f}",
                f"{rate:.0f}",
                f"{rate / b_rate:.2f}",
                f"{r.round_trips:.2f}",
                f"{r.commands:.2f}",
                f"{r.scripts:.2f}",
            ])  # fmt: skip
        if not r.throughputs:
            continue
        tput, b_tput = statistics.median(r.throughputs), statistics.median(b.throughputs)
        busy.append([
            r.subject.name,
            f"{tput:.0f}",
            f"{tput / b_tput:.2f}",
            f"{r.min_share:.1%}",
            "yes" if r.exclusive else "**NO**",
            f"{statistics.median(r.load):.1f}",
            r.subject.note,
        ])  # fmt: skip
    return (
        "Uncontended acquire + release, one worker:\n\n"
        + _markdown(
            ["lock", "median µs", "p99 µs", "cycles/s", "x headway", "round trips",
             "server cmds", "scripts"],
            calm,
        )
        + f"\n\nContended, {workers} workers on one key:\n\n"
        + _markdown(
            ["lock", "grants/s", "x headway", "lowest share", "exclusive", "server cmds/grant",
             "note"],
            busy,
        )
    )  # fmt: skip


def targets(results: list[Result], many: dict[str, float]) -> str:
    """The issue's targets, measured: met or NOT met, no rounding in headway's favour."""
    r = {x.subject.name: x for x in results}
    med = statistics.median
    if not {"redis-py asyncio Lock", "redis-py Lock"} <= r.keys():
        return "(needs the redis-py rows: run without --only)"

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    rows = []
    for name in ("headway async", "headway sync"):
        trips = r[name].round_trips
        rows.append(
            f"- {name}: {trips:.2f} round trips per uncontended cycle "
            f"(target: exactly 2): {verdict(trips == 2)}"
        )
    mine, peer = r["headway async"], r["redis-py asyncio Lock"]
    # Mean-based cycles/s swing with every stall of a busy machine: the median latency must agree.
    by_rate = med(mine.rates) / med(peer.rates)
    by_median = med(peer.latencies) / med(mine.latencies)
    rows.append(
        f"- headway async uncontended throughput = {by_rate:.2f} x redis-py asyncio Lock "
        f"by cycles/s, {by_median:.2f} x by median latency (target: >= 1.5 both): "
        f"{verdict(min(by_rate, by_median) >= 1.5)}"
    )
    if many:
        ratio = many["headway async"] / many["redis-py asyncio Lock"]
        rows.append(
            f"- headway async throughput with 64 locks taken concurrently = {ratio:.2f} x "
            f"redis-py asyncio Lock (target: >= 1.5): {verdict(ratio >= 1.5)}"
        )
    for name, other in (
        ("headway async", "redis-py asyncio Lock"),
        ("headway sync", "redis-py Lock"),
    ):
        share = r[name].min_share
        rows.append(
            f"- {name} under contention: lowest worker share {share:.1%} "
            f"(target: >= 8%): {verdict(share >= 0.08)}"
        )
        tput = med(r[name].throughputs) / med(r[other].throughputs)
        rows.append(
            f"- {name} contended throughput = {tput:.2f} x {other}, whose lowest worker "
            f"share is {r[other].min_share:.1%} (target: >= 2): {verdict(tput >= 2)}"
        )
    return "\n".join(rows)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short round (< 30 s)")
    parser.add_argument("--url", help="use this Redis instead of a private redis-server")
    parser.add_argument("--only", default="", help="only the locks whose name contains this")
    parser.add_argument(
        "--think", type=float, default=0.0, metavar="MS",
        help="milliseconds each contending worker works outside the lock between grants",
    )  # fmt: skip
    args = parser.parse_args()
    cfg = dataclasses.replace(QUICK if args.quick else FULL, think=args.think / 1000)
    began = time.monotonic()
    with redis_url(args.url) as url:
        version = redis.Redis.from_url(url).info("server")["redis_version"]
        results = run(url, cfg, args.url is None, args.only)
        many = run_many(url, cfg) if not args.only else {}
    print(f"\nRedis {version}, {cfg.workers} workers, {cfg.rounds} round(s) of "
          f"{cfg.cycles} cycles and {cfg.seconds:g} s of contention each "
          f"(think time {cfg.think * 1000:g} ms), "
          f"{time.monotonic() - began:.0f} s in all\n")  # fmt: skip
    print(tables(results, cfg.workers))
    if many:
        print("\n" + many_table(many, 64))
    print("\nTargets:\n" + targets(results, many))


if __name__ == "__main__":
    main()
