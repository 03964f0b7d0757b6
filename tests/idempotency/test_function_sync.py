"""``idempotent_function`` on sync functions, called from plain threads (no event loop)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from headway import (
    IdempotencyEvent,
    IdempotencyInProgress,
    ResultNotSerializable,
)
from tests.idempotency.functions import KITS, Kit, portal_kit

THREADS = 12


@pytest.fixture(params=KITS)
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kit]:
    with portal_kit(request, tmp_path) as opened:
        yield opened


def test_threads_one_key_wait_body_runs_once(kit: Kit) -> None:
    runs: list[str] = []
    calls: list[str] = []
    guard = threading.Lock()
    everyone_called = threading.Event()

    def key(order: str) -> str:
        with guard:
            calls.append(order)
            if len(calls) == THREADS:
                everyone_called.set()
        return order

    @kit.decorator(key=key, on_conflict="wait", wait_timeout=30)
    def ship(order: str) -> dict[str, object]:
        runs.append(threading.current_thread().name)
        assert everyone_called.wait(30)  # every duplicate is in flight before the first ends
        return {"order": order, "shipment": len(runs)}

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(ship, ["o-1"] * THREADS))
    assert len(runs) == 1
    assert runs[0] != threading.current_thread().name  # the body ran in a caller's thread
    assert results == [{"order": "o-1", "shipment": 1}] * THREADS


def test_threads_one_key_raise(kit: Kit) -> None:
    conflicts = 0
    refused_all = threading.Event()
    guard = threading.Lock()

    def hook(event: IdempotencyEvent) -> None:
        nonlocal conflicts
        with guard:
            conflicts += event.kind == "conflict"
            if conflicts == THREADS - 1:
                refused_all.set()

    runs = 0

    @kit.decorator(on_event=hook)
    def ship(order: str) -> str:
        nonlocal runs
        runs += 1
        assert refused_all.wait(30)
        return f"shipped {order}"

    def call(order: str) -> object:
        try:
            return ship(order)
        except IdempotencyInProgress as exc:
            return exc

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(call, ["o-2"] * THREADS))
    assert runs == 1
    assert sum(isinstance(r, IdempotencyInProgress) for r in results) == THREADS - 1
    assert [r for r in results if isinstance(r, str)] == ["shipped o-2"]
    assert ship("o-2") == "shipped o-2"


def test_an_exception_in_a_sync_body_releases_the_key(kit: Kit) -> None:
    seen: list[str] = []
    attempts = 0

    @kit.decorator(on_event=lambda event: seen.append(event.kind))
    def import_file(path: str) -> int:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise OSError("disk busy")
        return 3

    with pytest.raises(OSError, match="disk busy"):
        import_file("a.csv")
    assert import_file("a.csv") == 3
    assert import_file("a.csv") == 3
    assert attempts == 2
    assert seen == ["claimed", "released", "claimed", "completed", "replayed"]


def test_a_sync_result_that_cannot_be_stored(kit: Kit) -> None:
    results: list[object] = [object(), 1]

    @kit.decorator()
    def make(x: int) -> object:
        return results.pop(0)

    with pytest.raises(ResultNotSerializable, match=r"builtins\.object"):
        make(1)
    assert make(1) == 1


def test_a_sync_function_from_a_thread_with_no_loop(kit: Kit) -> None:
    @kit.decorator()
    def add(a: int, b: int) -> int:
        return a + b

    out: list[int] = []
    thread = threading.Thread(target=lambda: out.extend([add(1, 2), add(1, 2)]))
    thread.start()
    thread.join(30)
    assert out == [3, 3]
