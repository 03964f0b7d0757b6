"""Redlock: one lock over N independent Redis servers (``backend.py``), sent to all of
them at once over headway's pipelined connections (``nodes.py``)."""

from headway.lock.backends.redlock.backend import RedlockBackend

__all__ = ["RedlockBackend"]
