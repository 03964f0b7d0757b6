"""What comparing a JSON body as data costs per request, against comparing its bytes.

    PYTHONPATH=. uv run python benchmarks/fingerprint_cost.py [--rounds 21]

For a small payment body, a 10 kB and a 1 MB JSON body: ``default_fingerprint`` with a
non-JSON content type (the bytes hashed, as before issue 25), the same body as
``application/json`` (parsed, checked for duplicate keys, re-serialised sorted, hashed),
``fingerprint_fields("amount", "currency")``, and, for scale, a bare ``json.loads`` of the
body (what an endpoint that reads the JSON pays anyway). In process, no I/O; each round
times a batch of calls; the median of the rounds' per-call means, in µs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from headway import default_fingerprint, fingerprint_fields

PAYMENT = {
    "amount": 1999,
    "currency": "EUR",
    "customer": "cus_8f3a2b",
    "description": "Order #10023",
    "metadata": {"order_id": "10023", "channel": "web"},
}


def order(size: int) -> dict[str, Any]:
    """A JSON order of about ``size`` bytes: line items with nested objects, floats, text."""
    rng = random.Random(25)
    items: list[dict[str, Any]] = []
    doc: dict[str, Any] = {"amount": 0, "currency": "EUR", "items": items}
    length = len(json.dumps(doc))
    while length < size:
        item = {
            "sku": f"SKU-{rng.randrange(10**6):06d}",
            "name": f"Article nº {len(items)}",
            "quantity": rng.randrange(1, 9),
            "price": round(rng.uniform(1, 500), 2),
            "tags": ["sale", "eu"],
            "dimensions": {"w": rng.randrange(100), "h": rng.randrange(100)},
        }
        items.append(item)
        length += len(json.dumps(item)) + 2  # and the ", " before it
    doc["amount"] = len(items)
    return doc


def scope(content_type: str) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/payments",
        "raw_path": b"/payments",
        "query_string": b"",
        "headers": [(b"content-type", content_type.encode())],
    }


def per_call_us(fn: Callable[[], object], rounds: int, budget: float = 0.05) -> float:
    """Median over ``rounds`` of the mean µs per call in a batch of about ``budget`` s."""
    started = time.perf_counter()
    fn()
    batch = max(1, int(budget / max(time.perf_counter() - started, 1e-7)))
    means = []
    for _ in range(rounds):
        started_ns = time.perf_counter_ns()
        for _ in range(batch):
            fn()
        means.append((time.perf_counter_ns() - started_ns) / batch / 1000)
    return statistics.median(means)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    rounds = parser.parse_args().rounds
    raw, as_json = scope("application/octet-stream"), scope("application/json")
    by_fields = fingerprint_fields("amount", "currency")
    bodies = {
        "payment": json.dumps(PAYMENT).encode(),
        "10 kB": json.dumps(order(10_000)).encode(),
        "1 MB": json.dumps(order(1_000_000)).encode(),
    }
    print("| body | bytes | raw µs | canonical µs | x raw | fields µs | json.loads µs |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, body in bodies.items():
        bytes_ = per_call_us(partial(default_fingerprint, raw, body), rounds)
        data = per_call_us(partial(default_fingerprint, as_json, body), rounds)
        fields = per_call_us(partial(by_fields, as_json, body), rounds)
        loads = per_call_us(partial(json.loads, body.decode()), rounds)
        print(
            f"| {name} | {len(body):,} | {bytes_:,.1f} | {data:,.1f} | {data / bytes_:.1f} "
            f"| {fields:,.1f} | {loads:,.1f} |"
        )


if __name__ == "__main__":
    main()
