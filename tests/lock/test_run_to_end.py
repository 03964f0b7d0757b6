"""``run_to_end()``: a call already sent runs to its end; its effect is undone on cancellation."""

from __future__ import annotations

import asyncio

import pytest

from headway.lock.driver import run_to_end

pytestmark = pytest.mark.anyio


async def test_cancelled_as_the_call_finishes_still_undoes() -> None:
    undone: list[str] = []
    caller: asyncio.Task[str]

    async def call() -> str:
        caller.cancel()  # lands in the very step in which the call finishes
        return "granted"

    async def undo(result: str) -> None:
        undone.append(result)

    caller = asyncio.ensure_future(run_to_end(call(), undo))
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert undone == ["granted"]


async def test_cancelled_while_running_waits_then_undoes() -> None:
    undone: list[str] = []
    started, go_on = asyncio.Event(), asyncio.Event()

    async def call() -> str:
        started.set()
        await go_on.wait()
        return "granted"

    async def undo(result: str) -> None:
        undone.append(result)

    caller = asyncio.ensure_future(run_to_end(call(), undo))
    await started.wait()
    caller.cancel()
    await asyncio.sleep(0)
    assert not caller.done()  # still finishing the call
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert undone == ["granted"]


async def test_cancellation_wins_over_a_later_error() -> None:
    caller: asyncio.Task[None]

    async def call() -> None:
        caller.cancel()
        raise ConnectionError("reply lost")

    caller = asyncio.ensure_future(run_to_end(call()))
    with pytest.raises(asyncio.CancelledError) as caught:
        await caller
    assert isinstance(caught.value.__cause__, ConnectionError)


async def test_result_and_error_pass_through() -> None:
    async def ok() -> int:
        return 3

    async def bad() -> None:
        raise ConnectionError("down")

    assert await run_to_end(ok()) == 3
    with pytest.raises(ConnectionError):
        await run_to_end(bad())
