"""``complete()``: a request already sent runs to its end even if the caller is cancelled."""

from __future__ import annotations

import asyncio

import pytest

from headway.lock._backend import complete

pytestmark = pytest.mark.anyio


async def test_a_cancelled_caller_gets_the_request_finished_then_undone() -> None:
    started, finish = asyncio.Event(), asyncio.Event()
    undone: list[str] = []

    async def request() -> str:
        started.set()
        await finish.wait()
        return "granted"

    async def undo(result: str) -> None:
        undone.append(result)

    caller = asyncio.create_task(complete(request(), undo))
    await started.wait()
    caller.cancel()
    await asyncio.sleep(0)  # the cancellation reaches the caller, not the request
    assert not caller.done()
    finish.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert undone == ["granted"]


async def test_a_cancelled_caller_stays_cancelled_when_the_request_then_fails() -> None:
    started, finish = asyncio.Event(), asyncio.Event()

    async def request() -> str:
        started.set()
        await finish.wait()
        raise ConnectionError("Redis went away")

    async def undo(result: str) -> None:
        raise AssertionError("nothing to undo")

    caller = asyncio.create_task(complete(request(), undo))
    await started.wait()
    caller.cancel()
    await asyncio.sleep(0)
    finish.set()
    with pytest.raises(asyncio.CancelledError) as raised:
        await caller
    assert isinstance(raised.value.__cause__, ConnectionError)


async def test_an_uncancelled_caller_sees_the_request_fail() -> None:
    async def request() -> str:
        raise ConnectionError("Redis went away")

    with pytest.raises(ConnectionError):
        await complete(request())
