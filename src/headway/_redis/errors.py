"""What a Redis failure means to headway: one tuple of "not answering" errors, one mapping."""

from __future__ import annotations

from redis import exceptions as redis_errors

from headway._errors import BackendUnavailable

__all__ = ["UNAVAILABLE", "slot_moving", "unavailable"]

#: Errors that mean "Redis is not answering", as opposed to a bug in a request.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ClusterError,
    redis_errors.TryAgainError,
    # Out of memory (maxmemory, noeviction): refused before it ran, as it cannot serve.
    redis_errors.OutOfMemoryError,
    OSError,
    TimeoutError,
)


def unavailable(exc: BaseException, timeout: float | None = None) -> BackendUnavailable:
    """The ``BackendUnavailable`` a caller sees for ``exc`` (one of ``UNAVAILABLE``)."""
    within = "" if timeout is None else f" within {timeout:g} s"
    return BackendUnavailable(
        f"Redis did not answer{within}: {type(exc).__name__}: {exc}", backend="redis"
    )


def slot_moving(exc: BaseException) -> bool:
    """Whether ``exc`` is a script refused because its slot is moving between Cluster
    nodes (a resharding): the script stopped at a key that had already left, or was not
    there yet. Its caller sees ``BackendUnavailable``, as for a lost reply: what ran
    before the stop stays (scripts do not roll back), which the lock scripts allow for,
    as for a call whose reply was lost.
    """
    return isinstance(exc, redis_errors.ResponseError) and "non local key" in str(exc)
