"""``locked``: a function run under ``hold()`` on a name from its arguments, over every
async backend in ``LOCK_BACKENDS`` (conftest), every sync one in ``SYNC_LOCK_BACKENDS``,
and the read mode over every ``LOCK_BACKENDS`` entry with ``modes``."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from typing import assert_type

import pytest

from headway import (
    Lease,
    Lock,
    LockBackend,
    LockLost,
    LockNotAcquired,
    MemoryLockBackend,
    ModalLockBackend,
    ReadWriteLock,
    SyncLock,
    SyncLockBackend,
    SyncModalLockBackend,
    SyncReadWriteLock,
    current_lease,
    locked,
)

pytestmark = pytest.mark.anyio


async def test_calls_on_one_name_exclude_each_other_counted_exactly(
    lock_backend: LockBackend,
) -> None:
    balance = {"a": 0, "b": 0}
    inside = {"a": 0, "b": 0}
    overlaps = []

    @locked(lock_backend, "account:{account}", ttl=10, timeout=30)
    async def deposit(account: str, amount: int) -> int:
        inside[account] += 1
        if inside[account] > 1:
            overlaps.append(account)
        seen = balance[account]
        await asyncio.sleep(0)  # a lost update if two ran at once
        balance[account] = seen + amount
        inside[account] -= 1
        return balance[account]

    calls = 40
    async with asyncio.TaskGroup() as tg:
        for i in range(calls):
            tg.create_task(deposit("a" if i % 2 else "b", 1))
    assert overlaps == []
    assert balance == {"a": calls // 2, "b": calls // 2}


async def test_skip_returns_none_without_running_and_raise_raises(
    lock_backend: LockBackend,
) -> None:
    ran = []

    @locked(lock_backend, "job:{name}", timeout=0, on_timeout="skip")
    async def skipping(name: str) -> str:
        ran.append(name)
        return "ran"

    @locked(lock_backend, "job:{name}", timeout=0)
    async def raising(name: str) -> str:
        ran.append(name)
        return "ran"

    lock = Lock(lock_backend, "job:nightly", ttl=10)
    lease = await lock.acquire(timeout=0)
    assert await skipping("nightly") is None
    with pytest.raises(LockNotAcquired) as caught:
        await raising("nightly")
    assert caught.value.resource == "job:nightly"
    assert ran == []
    assert await skipping("other") == "ran"  # another name is free
    await lock.release(lease)
    assert await skipping("nightly") == "ran"
    assert await raising("nightly") == "ran"
    await lock.release(await lock.acquire(timeout=0))  # released after each call


async def test_the_body_sees_its_lease_and_fence(lock_backend: LockBackend) -> None:
    @locked(lock_backend, "invoice:{invoice_id}", ttl=10)
    async def pay(invoice_id: int) -> Lease:
        return current_lease()

    first, second = await pay(7), await pay(7)
    assert first.resource == second.resource == "invoice:7"
    assert second.fence > first.fence
    with pytest.raises(LookupError):
        current_lease()


async def test_a_lost_lease_cancels_the_body(lock_backend: LockBackend) -> None:
    reached_end = False
    thief: list[Lease] = []

    @locked(lock_backend, "r", ttl=0.6, renew_every=0.1)
    async def work() -> None:
        nonlocal reached_end
        lease = current_lease()
        await lock_backend.release(lease)  # someone else takes over, as after an expiry
        thief.append(await lock_backend.acquire("r", 5, 0))
        await asyncio.Event().wait()
        reached_end = True

    with pytest.raises(LockLost):
        async with asyncio.timeout(5):
            await work()
    assert not reached_end
    await lock_backend.release(thief[0])  # the thief's lease was not touched


async def test_the_body_raising_lock_not_acquired_is_no_skip(lock_backend: LockBackend) -> None:
    @locked(lock_backend, "outer", timeout=0, on_timeout="skip")
    async def nested() -> None:
        await Lock(lock_backend, "inner").acquire(timeout=0)

    inner = await Lock(lock_backend, "inner", ttl=10).acquire(timeout=0)
    with pytest.raises(LockNotAcquired) as caught:
        await nested()
    assert caught.value.resource == "inner"
    await lock_backend.release(inner)


async def test_read_mode_shares_and_write_mode_excludes(modal_backend: ModalLockBackend) -> None:
    @locked(modal_backend, "report:{month}", mode="read", timeout=0, on_timeout="skip")
    async def read(month: str) -> int:
        return current_lease().fence

    @locked(modal_backend, "report:{month}", mode="write", timeout=0, on_timeout="skip")
    async def write(month: str) -> int:
        return current_lease().fence

    rw = ReadWriteLock(modal_backend, "report:11", ttl=10)
    reader = await rw.read.acquire(timeout=0)
    assert await read("11") is not None  # shared with the reader
    assert await write("11") is None  # a reader holds it
    await rw.read.release(reader)
    assert await write("11") is not None


# -- sync -------------------------------------------------------------------------------


def test_sync_calls_exclude_each_other_counted_exactly(sync_lock_backend: SyncLockBackend) -> None:
    counter = [0]
    inside = [0]
    overlaps = []

    @locked(sync_lock_backend, "counter:{key}", ttl=10, timeout=30)
    def bump(key: str) -> int:
        inside[0] += 1
        if inside[0] > 1:
            overlaps.append(key)
        seen = counter[0]
        time.sleep(0.0005)  # a lost update if two ran at once
        counter[0] = seen + 1
        inside[0] -= 1
        return current_lease().fence

    threads, each = 4, 25
    fences: list[int] = []

    def worker() -> None:
        fences.extend(bump("k") for _ in range(each))

    started = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    assert overlaps == []
    assert counter[0] == threads * each
    assert len(set(fences)) == threads * each


def test_sync_skip_and_raise(sync_lock_backend: SyncLockBackend) -> None:
    @locked(sync_lock_backend, lambda name: f"job:{name}", timeout=0, on_timeout="skip")
    def skipping(name: str) -> str:
        return current_lease().resource

    @locked(sync_lock_backend, "job:{name}", timeout=0)
    def raising(name: str) -> str:
        return name

    lock = SyncLock(sync_lock_backend, "job:x", ttl=10)
    lease = lock.acquire(timeout=0)
    assert skipping("x") is None
    with pytest.raises(LockNotAcquired):
        raising("x")
    lock.release(lease)
    assert skipping("x") == "job:x"
    assert raising("x") == "x"


def test_sync_lost_lease_is_reported_when_the_body_ends(
    sync_lock_backend: SyncLockBackend,
) -> None:
    @locked(sync_lock_backend, "r", ttl=0.6, renew_every=0.1)
    def work() -> None:
        lease = current_lease()
        sync_lock_backend.release(lease)
        thief = sync_lock_backend.acquire("r", 5, 0)
        time.sleep(0.3)  # renewals are refused meanwhile
        sync_lock_backend.release(thief)

    with pytest.raises(LockLost):
        work()


def test_sync_read_mode_shares_and_write_mode_excludes(
    sync_modal_backend: SyncModalLockBackend,
) -> None:
    @locked(sync_modal_backend, "report:{month}", mode="read", timeout=0, on_timeout="skip")
    def read(month: str) -> str:
        return current_lease().resource

    @locked(sync_modal_backend, "report:{month}", mode="write", timeout=0, on_timeout="skip")
    def write(month: str) -> str:
        return current_lease().resource

    rw = SyncReadWriteLock(sync_modal_backend, "report:11", ttl=10)
    reader = rw.read.acquire(timeout=0)
    assert read("11") == "report:11"
    assert write("11") is None
    rw.read.release(reader)
    assert write("11") == "report:11"


# -- names, signature, typing (no backend needed) ----------------------------------------


async def test_names_from_defaults_attributes_kwargs_and_functions() -> None:
    backend = MemoryLockBackend()

    class User:
        id = 42

    @locked(backend, "user:{user.id}:{kind}")
    async def one(user: User, kind: str = "full") -> str:
        return current_lease().resource

    @locked(backend, "tag:{tag}")
    async def spread(**labels: str) -> str:
        return current_lease().resource

    @locked(backend, lambda a, b: f"pair:{min(a, b)}-{max(a, b)}")
    async def pair(a: int, b: int) -> str:
        return current_lease().resource

    assert await one(User()) == "user:42:full"
    assert await one(User(), kind="x") == "user:42:x"
    assert await spread(tag="t") == "tag:t"
    assert await pair(3, 1) == "pair:1-3"


async def test_bad_names_are_clear_errors() -> None:
    backend = MemoryLockBackend()
    with pytest.raises(ValueError, match="names 'invoice', which is no parameter"):

        @locked(backend, "invoice:{invoice}")
        async def pay(invoice_id: int) -> None: ...

    with pytest.raises(ValueError, match="not positions"):

        @locked(backend, "invoice:{0}")
        async def pay2(invoice_id: int) -> None: ...

    @locked(backend, "tag:{tag}")
    async def spread(**labels: str) -> None: ...

    with pytest.raises(ValueError, match=r"cannot format it from the arguments \['other'\]"):
        await spread(other="x")  # known only at call time

    @locked(backend, lambda n: n)
    async def numbered(n: int) -> None: ...

    with pytest.raises(TypeError, match="returned int, not a str"):
        await numbered(1)

    @locked(backend, "x:{n}")
    async def typed(n: int) -> None: ...

    with pytest.raises(TypeError):
        await typed()  # type: ignore[call-arg]


def test_async_and_sync_backends_are_matched_to_the_function() -> None:
    backend = MemoryLockBackend()
    with pytest.raises(ValueError, match="is sync but the memory lock backend is async"):

        @locked(backend, "x")  # type: ignore[arg-type]
        def work() -> None: ...

    with pytest.raises(ValueError, match='on_timeout must be "raise" or "skip"'):
        locked(backend, "x", on_timeout="never")  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="does not offer read-write locks"):
        locked(_NoModes(), "x", mode="read")


class _NoModes:
    name = "plain"

    async def acquire(self, resource: str, ttl: float, timeout: float) -> Lease:
        raise NotImplementedError

    async def release(self, lease: Lease) -> None:
        raise NotImplementedError

    async def extend(self, lease: Lease, ttl: float) -> Lease:
        raise NotImplementedError


async def test_the_wrapper_keeps_signature_name_and_types() -> None:
    backend = MemoryLockBackend()

    async def pay(invoice_id: int, *, amount: float = 0.0) -> str:
        """Pay an invoice."""
        return f"{invoice_id}:{amount}"

    wrapped = locked(backend, "invoice:{invoice_id}")(pay)
    skipping = locked(backend, "invoice:{invoice_id}", on_timeout="skip")(pay)
    assert wrapped.__wrapped__ is pay  # type: ignore[attr-defined]
    assert wrapped.__name__ == "pay"
    assert wrapped.__doc__ == "Pay an invoice."
    assert inspect.signature(wrapped) == inspect.signature(pay)
    assert inspect.iscoroutinefunction(wrapped)
    assert_type(await wrapped(1, amount=2.0), str)
    assert_type(await skipping(1), str | None)
    assert await wrapped(1, amount=2.0) == "1:2.0"
