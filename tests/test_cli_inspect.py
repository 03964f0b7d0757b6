"""``headway lock`` and ``headway ratelimit`` against the real servers, through ``main``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import redis
import sqlalchemy as sa

from headway import SyncLock, SyncMySQLLockBackend, SyncRateLimiter, SyncRedisLockBackend
from headway.cli import main
from headway.lock.shared import SyncReadWriteLock, SyncSemaphore
from headway.ratelimit.backends.sync_redis import SyncRedisRateLimitBackend
from headway.ratelimit.policies import FixedWindow, TokenBucket


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("headway: ")
    assert "Traceback" not in err
    return err


@pytest.fixture
def name() -> str:
    return f"cli-{uuid.uuid4().hex}"


@pytest.fixture
def redis_locks(redis_url: str) -> Iterator[SyncRedisLockBackend]:
    backend = SyncRedisLockBackend(redis.Redis.from_url(redis_url))
    try:
        yield backend
    finally:
        backend.close()
        backend.client.close()


@pytest.mark.redis
def test_lock_shows_holder_owner_and_waiters(
    redis_url: str, redis_locks: SyncRedisLockBackend, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["lock", name, "--url", redis_url]) == 0
    assert capsys.readouterr().out.endswith(f"{name!r} on {redis_url}: free, 0 waiting\n")
    lock = SyncLock(redis_locks, name, ttl=30, owner="web-3:pid-17")
    lease = lock.acquire()
    assert main(["lock", name, "--url", redis_url]) == 0
    out = capsys.readouterr().out
    assert f"held by 1, 0 waiting\n  fence {lease.fence}  expires in " in out
    assert "owner web-3:pid-17  mode exclusive" in out
    assert lease.token.rpartition(".")[2] not in out  # a token releases: never shown
    assert main(["lock", name, "--url", redis_url, "--json"]) == 0
    [holder] = json.loads(capsys.readouterr().out)["holders"]
    assert (holder["fence"], holder["owner"], holder["mode"]) == (
        lease.fence,
        "web-3:pid-17",
        "exclusive",
    )
    assert 0 < holder["expires_in"] <= 30
    lock.release(lease)


@pytest.mark.redis
def test_lock_modes_show_readers_and_permits(
    redis_url: str, redis_locks: SyncRedisLockBackend, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rw = SyncReadWriteLock(redis_locks, name, ttl=30)
    readers = [rw.read.acquire(), rw.read.acquire()]
    semaphore = SyncSemaphore(redis_locks, name, permits=3, ttl=30, owner="batch")
    permit = semaphore.acquire()
    assert main(["lock", name, "--url", redis_url, "--mode", "rw", "--json"]) == 0
    state = json.loads(capsys.readouterr().out)
    assert [(h["fence"], h["mode"]) for h in state["holders"]] == [
        (r.fence, "read") for r in sorted(readers, key=lambda r: r.fence)
    ]
    assert main(["lock", name, "--url", redis_url, "--mode", "permits"]) == 0
    assert f"fence {permit.fence}  expires in" in capsys.readouterr().out
    assert main(["lock", name, "--url", redis_url]) == 0  # the exclusive lock is apart
    assert "free, 0 waiting" in capsys.readouterr().out
    for reader in readers:
        rw.read.release(reader)
    semaphore.release(permit)


@pytest.mark.mysql
def test_lock_on_mysql_shows_the_holder(
    mysql_url: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = sa.create_engine(sa.make_url(mysql_url).set(drivername="mysql+pymysql"))
    backend = SyncMySQLLockBackend(engine)
    lease = SyncLock(backend, name, ttl=30).acquire()
    try:
        url = sa.make_url(mysql_url).set(drivername="mysql").render_as_string(False)
        assert main(["lock", name, "--url", url]) == 0
        out = capsys.readouterr().out
        assert f"fence {lease.fence}  expires in unknown  owner (none)" in out
    finally:
        backend.close()
        engine.dispose()


def test_lock_reads_every_other_server(
    postgres_url: str, etcd_url: str, zookeeper_hosts: str, name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    postgres = sa.make_url(postgres_url).set(drivername="postgresql").render_as_string(False)
    etcd = "etcd://" + etcd_url.partition("://")[2]
    for url, namespace in (
        (postgres, None),
        (etcd, f"headway-test/{name}/"),
        (f"zookeeper://{zookeeper_hosts}", f"/headway-test/{name}"),
    ):
        extra = [] if namespace is None else ["--namespace", namespace]
        for mode in ("exclusive", "rw", "permits"):
            assert main(["lock", name, "--url", url, "--mode", mode, *extra]) == 0, url
            assert capsys.readouterr().out.endswith(": free, 0 waiting\n")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://127.0.0.1:1/0", "cannot use redis://127.0.0.1:1/0: "),
        ("redis://:s3cret@127.0.0.1:1/0", "redis://:***@127.0.0.1:1/0"),
        ("postgresql://u@127.0.0.1:1/db", "cannot use postgresql://u@127.0.0.1:1/db: "),
        ("gopher://host/x", "unknown scheme 'gopher'"),
        ("localhost:6379", "is not a URL"),
    ],
)
def test_lock_errors_are_one_line(url: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lock", "x", "--url", url, "--timeout", "1"]) == 2
    err = one_line_error(capsys)
    assert says in err
    assert "s3cret" not in err


@pytest.mark.redis
def test_ratelimit_peeks_without_charging_and_resets(
    redis_url: str, name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = SyncRedisRateLimitBackend(redis.Redis.from_url(redis_url))
    limiter = SyncRateLimiter(TokenBucket(10, 10, 60), backend=backend)
    for _ in range(3):
        limiter.hit(name)
    look = ["ratelimit", name, "--url", redis_url, "--policy", "10/minute"]
    for _ in range(2):  # looking twice charges nothing
        assert main(look) == 0
        assert "(token_bucket, 10 per 60 s): 7 of 10 left" in capsys.readouterr().out
    monkeypatch.setattr("builtins.input", lambda question: "n")
    assert main([*look, "--reset"]) == 1
    assert main([*look, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["remaining"] == 7
    assert main([*look, "--reset", "--yes"]) == 0
    assert "reset; 10 of 10 left" in capsys.readouterr().out
    assert limiter.peek(name).remaining == 10
    # Another policy, another state: the app's policy must be the one given.
    window = SyncRateLimiter(FixedWindow(5, 30), backend=backend)
    window.hit(name)
    assert main([*look[:4], "--policy", "5/30s", "--algorithm", "fixed_window", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["remaining"] == 4
    backend.close()
    backend.client.close()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--policy", "10/fortnight"], "write it as 100/minute"),
        (["--policy", "ten/minute"], "write it as 100/minute"),
        (["--policy", "0/minute"], "--policy '0/minute': TokenBucket.capacity must be"),
        (["--url", "postgresql://h/db", "--policy", "1/s"], "rate limits live on Redis"),
        (["--url", "redis://127.0.0.1:1", "--policy", "1/s"], "cannot use redis://127.0.0.1:1"),
    ],
)
def test_ratelimit_errors_are_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--url", "redis://127.0.0.1:1"] if "--url" not in argv else []
    assert main(["ratelimit", "k", *url, *argv, "--timeout", "1"]) == 2
    assert says in one_line_error(capsys)
