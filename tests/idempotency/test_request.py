import pytest

from headway.idempotency.request import InvalidKey, parse_key


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (b'"order-1"', "order-1"),  # the plain form, read without the parser
        (b' "a b" ', "a b"),
        (b'"~!#$%&()*+,-./:;<=>?@[]^_`{|}"', "~!#$%&()*+,-./:;<=>?@[]^_`{|}"),
        (b'"a\\"b\\\\c"', 'a"b\\c'),  # escapes: the full parser
        (b'"a";p=1', "a"),  # parameters: the full parser, ignored
        (b"order-1", "order-1"),  # bare token
    ],
)
def test_key_forms(raw: bytes, key: str) -> None:
    assert parse_key([raw]) == key


@pytest.mark.parametrize(
    "raw", [b'""', b'"a\x7f"', b'"\xe9"', b'"a" "b"', b'"a', b'"' + b"x" * 256 + b'"']
)
def test_malformed_quoted_keys(raw: bytes) -> None:
    with pytest.raises(InvalidKey):
        parse_key([raw])
