"""Who holds a PostgreSQL lock, and how many wait: ``inspect`` of the PostgreSQL backend
and its mode views, read from ``pg_locks`` (named queries ``holders`` and ``waiting`` of
``headway/sql/lock_modes.sql``).

A holder's fence is its transaction's id, read from the lock every transaction holds on
its own id, so every role can see it. Its owner rides in its session's
``application_name``, set for the transaction as ``headway:<owner>`` (``session_label``)
by the statement that asks for the lock; where ``pg_stat_activity`` hides another role's
sessions the owner is None. Its time left is None: the TTL is the holder's session
setting (``idle_in_transaction_session_timeout``), which no other session can read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headway.lock.introspection import (
    Holder,
    HolderMode,
    LockState,
    check_owner,
    current_owner,
)

if TYPE_CHECKING:
    from headway.lock.backends.postgres import PostgresLockBackend

__all__ = ["LABEL", "Target", "label_owner", "read_state", "session_label"]

#: What a session's ``application_name`` starts with while it asks for or holds a lease
#: with an owner; PostgreSQL keeps 63 bytes, so owners past 55 characters are cut.
LABEL = "headway:"
_NAME_MAX = 63
_LOW32 = (1 << 32) - 1


def session_label() -> str | None:
    """The ``application_name`` of the acquire under way (``owned_by``), or None: none
    to set (the session keeps its own)."""
    owner = current_owner()
    return None if owner is None else (LABEL + owner)[:_NAME_MAX]


def label_owner(name: str | None) -> str | None:
    """The owner a session's ``application_name`` names, or None (not ours, or hidden).

    Args:
        name: The ``application_name`` as ``pg_stat_activity`` shows it.
    """
    if not name or not name.startswith(LABEL):
        return None
    try:
        return check_owner(name[len(LABEL) :])
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Target:
    """Where one lock's holders and line are in ``pg_locks``.

    ``key`` is a 64-bit advisory key (``sub`` 1), or a two-int class whose every number
    is a slot (``sub`` 2, a semaphore's); ``line`` the 64-bit key its waiters queue
    on, ``head_counts`` whether its granted holder is in line too (a semaphore's gate);
    ``kind`` a holder's mode from whether it holds exclusively.
    """

    key: int
    sub: int
    line: int
    head_counts: bool
    kind: Callable[[bool], HolderMode]


async def read_state(backend: PostgresLockBackend, resource: str, target: Target) -> LockState:
    """The state of ``resource``'s lock at ``target``, read on a pooled connection."""
    from headway.lock.backends.postgres_modes import queries

    if target.sub == 1:
        classid, objid = (target.key >> 32) & _LOW32, target.key & _LOW32
    else:
        classid, objid = target.key, 0
    holders_params = {"classid": classid, "objid": objid, "subid": target.sub}
    line_params = {"key": target.line, "gate_counts": target.head_counts}
    try:
        async with backend.engine.connect() as conn:
            rows = (await backend._bounded(
                conn.execute(queries()["holders"], holders_params), backend.timeout
            )).all()  # fmt: skip
            waiting = (await backend._bounded(
                conn.execute(queries()["waiting"], line_params), backend.timeout
            )).scalar_one()  # fmt: skip
    except backend._unavailable_errors as exc:
        raise backend._unavailable(exc) from exc
    holders = sorted(
        (
            Holder(int(fence or 0), None, label_owner(name), target.kind(bool(exclusive)))
            for exclusive, fence, name in rows
        ),
        key=lambda holder: holder.fence,
    )
    return LockState(resource, tuple(holders), int(waiting))
