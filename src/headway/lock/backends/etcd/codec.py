"""What the etcd gateway's JSON means, without httpx: keys in base64, refusals as errors."""

from __future__ import annotations

import base64

__all__ = ["FAILED_PRECONDITION", "NOT_FOUND", "EtcdError", "b64", "unb64"]

NOT_FOUND = 5  # gRPC NotFound: "requested lease not found"
FAILED_PRECONDITION = 9  # gRPC FailedPrecondition: "lease already exists"


class EtcdError(Exception):
    """etcd refused a request (not an outage): ``code`` is the gRPC status code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"etcd error {code}: {message}")
        self.code = code


def b64(text: str) -> str:
    """A key as the gateway expects it."""
    return base64.b64encode(text.encode()).decode()


def unb64(text: str) -> str:
    """A key as the gateway returns it."""
    return base64.b64decode(text).decode()
