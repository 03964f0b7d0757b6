"""What Redis servers say they saw: commands run, error replies, connections.

Tests count headway's calls here rather than through its own counters: the server is
the one that ran them. ``commands_run`` tells headway's connections from redis-py's
too, since headway sends ``FCALL`` and redis-py's path ``EVALSHA``
(``headway._redis.scripts``). Each test worker has a Redis of its own
(``tests.workers``), so nothing else runs commands on it while a test counts.
"""

from __future__ import annotations

from collections import Counter

import redis

__all__ = ["commands_run", "connections_named", "errors_replied"]


def commands_run(*urls: str) -> Counter[str]:
    """Commands the servers at ``urls`` ran without an error, by name, summed.

    ``INFO commandstats``' ``calls`` less ``failed_calls``: a call refused before it ran
    (MOVED, ASK, TRYAGAIN) is not counted, nor one that failed (an ``FCALL`` answered
    "Function not found", which headway sends again with its library).
    """
    total: Counter[str] = Counter()
    for url in urls:
        with redis.Redis.from_url(url) as server:
            stats = server.info("commandstats")
        for name, counts in stats.items():
            total[name.removeprefix("cmdstat_")] += counts["calls"] - counts["failed_calls"]
    return total


def errors_replied(*urls: str) -> Counter[str]:
    """Error replies the servers at ``urls`` sent, by first word (``MOVED``, ``ASK``, ``ERR``)."""
    total: Counter[str] = Counter()
    for url in urls:
        with redis.Redis.from_url(url) as server:
            stats = server.info("errorstats")
        for name, counts in stats.items():
            total[name.removeprefix("errorstat_")] += counts["count"]
    return total


def connections_named(url: str, name: str) -> list[dict[str, str]]:
    """The server's connections named ``name`` (a client's ``client_name``), from ``CLIENT LIST``;
    each entry's ``cmd`` is the last command it ran."""
    with redis.Redis.from_url(url) as server:
        return [entry for entry in server.client_list() if entry["name"] == name]
