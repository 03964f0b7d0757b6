"""Every Redis key and channel name headway uses is built here.

Keys for one resource share a hash tag (``headway:{lock:<id>}:owner``) so one
script can touch all of them on Redis Cluster. Identifiers come from users, so
anything outside a small safe alphabet, or longer than 64 characters, is
replaced by a digest: ``{``, ``}``, ``:`` and megabyte-long names cannot break
the scheme, and a hashed name can never collide with a plain one because the
digest form starts with ``~``, which the safe alphabet excludes.
"""

from __future__ import annotations

import hashlib
import re

_SAFE = re.compile(r"[A-Za-z0-9_.\-/@]{1,64}")


def segment(identifier: str) -> str:
    """Return ``identifier`` as a key segment that is safe inside a hash tag."""
    if _SAFE.fullmatch(identifier):
        return identifier
    digest = hashlib.blake2b(identifier.encode("utf-8", "surrogatepass"), digest_size=16)
    return "~" + digest.hexdigest()


def tag_base(kind: str, identifier: str) -> str:
    """The prefix ``headway:{<kind>:<segment>}:`` shared by every key of one identifier."""
    return f"headway:{{{kind}:{segment(identifier)}}}:"


def tagged(kind: str, identifier: str, *parts: str) -> list[str]:
    """Keys ``headway:{<kind>:<segment>}:<part>``, one per part, sharing one hash tag."""
    base = tag_base(kind, identifier)
    return [base + part for part in parts]


def hash_tag(identifier: str) -> str | None:
    """The Redis Cluster hash tag a user wrote into ``identifier``, by Redis's own rule:
    the text between its first ``{`` and the first ``}`` after it, if not empty; else None.
    """
    start = identifier.find("{")
    if start < 0:
        return None
    end = identifier.find("}", start + 1)
    return identifier[start + 1 : end] if end > start + 1 else None
