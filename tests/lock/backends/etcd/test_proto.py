"""The hand-written protobuf messages of the gRPC transport: bytes as protobuf has them."""

from __future__ import annotations

from headway.lock.backends.etcd import proto
from headway.lock.backends.etcd.codec import b64


def test_a_txn_travels_in_the_gateways_shape_and_back() -> None:
    body = {
        "compare": [{"key": b64("k"), "target": "LEASE", "result": "EQUAL", "lease": "-5"}],
        "success": [{"request_put": {"key": b64("k"), "lease": "7", "ignore_value": True}}],
        "failure": [{"request_range": {"key": b64("k"), "sort_order": "DESCEND", "limit": "2"}}],
    }
    # The first compare, by hand: field 1 (length 18) = key "k" (field 3), target 4
    # (LEASE, field 2), result 0 (EQUAL, field 1), lease -5 (field 8: ten bytes of
    # two's complement), in the order given.
    compare = bytes([0x0A, 18, 0x1A, 1, ord("k"), 0x10, 4, 0x08, 0, 0x40])
    compare += bytes([0xFB] + [0xFF] * 8 + [0x01])
    encoded = proto.encode(proto.TXN, body)
    assert encoded.startswith(compare)
    assert proto.decode(proto.TXN, encoded) == body


def test_replies_decode_packed_enums_and_skip_unknown_fields() -> None:
    unknown = bytes([0x78, 0x01])  # field 15, a varint: not in the table
    reply = proto.encode(proto.WATCH_REPLY, {"created": True, "watch_id": "3"}) + unknown
    assert proto.decode(proto.WATCH_REPLY, reply) == {"created": True, "watch_id": "3"}
    packed = bytes([0x2A, 2, 0, 1])  # field 5, length 2: NOPUT, NODELETE
    assert proto.decode(proto.WATCH_CREATE, packed) == {"filters": ["NOPUT", "NODELETE"]}
