"""``RecordStore.inspect`` and ``headway record``: one record's status, times, fingerprint
and response size, never its body, on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from headway import RecordStatus, RecordStore, StoredResponse
from headway.cli import main
from headway.idempotency.table import metadata

BODY = b'{"card": "4242 4242 4242 4242", "secret": "s3cret-body"}'


@pytest.mark.anyio
async def test_a_completed_record_shows_its_response_size_not_its_body(
    store: RecordStore,
) -> None:
    before = datetime.now(UTC)
    claim = await store.claim("alice", "k", "ab" * 32, lease_token="t", lease_ttl=30)
    assert claim.fence is not None
    response = StoredResponse(201, (("set-cookie", "sid=x"),), BODY)
    assert await store.complete("alice", "k", claim.fence, response)
    state = await store.inspect("alice", "k")
    assert state is not None
    assert (state.caller, state.key, state.status) == ("alice", "k", RecordStatus.COMPLETED)
    assert (state.fingerprint, state.fence) == ("ab" * 32, claim.fence)
    assert (state.response_status, state.response_size) == (201, len(BODY))
    assert state.lease_expires_at is None
    slack = timedelta(seconds=5)  # the database's clock, not this process's
    assert before - slack <= state.created_at <= datetime.now(UTC) + slack
    assert state.expires_at - state.created_at == pytest.approx(timedelta(seconds=60), abs=slack)
    assert not hasattr(state, "body")
    assert not hasattr(state, "headers")


@pytest.mark.anyio
async def test_a_record_in_flight_shows_its_lease_and_no_response(store: RecordStore) -> None:
    await store.claim("alice", "k", "cd" * 32, lease_token="t", lease_ttl=30)
    state = await store.inspect("alice", "k")
    assert state is not None
    assert state.status is RecordStatus.PROCESSING
    assert (state.response_status, state.response_size) == (None, None)
    assert state.lease_expires_at is not None
    lease = state.lease_expires_at - state.created_at
    assert lease == pytest.approx(timedelta(seconds=30), abs=timedelta(seconds=5))


@pytest.mark.anyio
async def test_a_body_not_kept_has_no_size(store: RecordStore) -> None:
    claim = await store.claim("alice", "k", "ef" * 32, lease_token="t", lease_ttl=30)
    assert claim.fence is not None
    await store.complete("alice", "k", claim.fence, StoredResponse(200, (), None))
    state = await store.inspect("alice", "k")
    assert state is not None
    assert (state.response_status, state.response_size) == (200, None)


@pytest.mark.anyio
async def test_another_caller_or_key_has_no_record(store: RecordStore) -> None:
    await store.claim("alice", "k", "ab" * 32, lease_token="t", lease_ttl=30)
    assert await store.inspect("bob", "k") is None
    assert await store.inspect("alice", "K") is None


# -- headway record ----------------------------------------------------------------------------


async def _records(url: str) -> int:
    """A fresh table holding alice's completed record of key ``k``; its fence."""
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(metadata.drop_all)
            await conn.run_sync(metadata.create_all)
    finally:
        await engine.dispose()
    store = RecordStore.from_url(url, create_table=False)
    try:
        claim = await store.claim("alice", "k", "ab" * 32, lease_token="t", lease_ttl=30)
        assert claim.fence is not None
        await store.complete("alice", "k", claim.fence, StoredResponse(201, (), BODY))
        return claim.fence
    finally:
        await store.aclose()


@pytest.fixture
def cli_url(database_url: str) -> str:
    """``database_url`` with a password where the server ignores it (PostgreSQL trusts)."""
    if database_url.startswith("postgresql"):
        return make_url(database_url).set(password="s3cret-pw").render_as_string(False)
    return database_url


def test_record_prints_the_record_without_its_body(
    cli_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fence = asyncio.run(_records(cli_url))
    assert main(["record", "--caller", "alice", "k", cli_url]) == 0
    out = capsys.readouterr().out
    assert out.startswith("record of key 'k' (caller 'alice') in ")
    assert ": COMPLETED\n" in out
    assert f"fingerprint  abababababab...  fence {fence}\n" in out
    assert f"response     status 201, body {len(BODY)} bytes\n" in out
    assert "s3cret" not in out  # neither the password nor the body
    assert "4242" not in out
    assert "ab" * 7 not in out  # the fingerprint is cut


def test_record_as_json(cli_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    asyncio.run(_records(cli_url))
    assert main(["record", "--caller", "alice", "k", cli_url, "--json"]) == 0
    shape = json.loads(capsys.readouterr().out)
    assert shape["status"] == "COMPLETED"
    assert (shape["response_status"], shape["response_size"]) == (201, len(BODY))
    assert shape["fingerprint_prefix"] == "abababababab"
    assert "fingerprint" not in shape  # only the prefix is shown
    assert datetime.fromisoformat(shape["expires_at"]) > datetime.fromisoformat(shape["created_at"])


def test_record_of_another_caller_is_none_found(
    cli_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_records(cli_url))
    assert main(["record", "--caller", "bob", "k", cli_url]) == 1
    out = capsys.readouterr().out
    assert out.startswith("no record for caller 'bob' and key 'k' in ")
    assert "s3cret-pw" not in out


def test_record_without_a_caller_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["record", "k", "sqlite+aiosqlite:///unused.sqlite3"])
    assert exit_.value.code == 2
    assert "--caller" in capsys.readouterr().err
