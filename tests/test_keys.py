import pytest
from hypothesis import given
from hypothesis import strategies as st

from headway._keys import segment, tagged


def test_plain_names_stay_readable() -> None:
    assert segment("orders/42") == "orders/42"
    assert tagged("lock", "orders/42", "owner") == ["headway:{lock:orders/42}:owner"]


@pytest.mark.parametrize("name", ["", "a{b}c", "x:y", "{", "}", "é", "a b", "x" * 65, "~abc"])
def test_hostile_names_are_hashed(name: str) -> None:
    seg = segment(name)
    assert seg.startswith("~")
    assert len(seg) == 33


@given(st.text())
def test_every_key_of_a_resource_shares_one_safe_hash_tag(name: str) -> None:
    keys = tagged("lock", name, "owner", "fence")
    tags = {key[key.index("{") + 1 : key.index("}")] for key in keys}
    assert len(tags) == 1
    for key in keys:
        assert key.count("{") == 1
        assert key.count("}") == 1
        assert len(key) < 100


@given(st.text(), st.text())
def test_distinct_names_never_share_keys(a: str, b: str) -> None:
    if a != b:
        assert segment(a) != segment(b)


def test_huge_name_is_bounded() -> None:
    assert len(segment("x" * 10_000_000)) == 33
