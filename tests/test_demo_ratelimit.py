import re

import pytest

from headway.cli import main


def test_demo_ratelimit_scene(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "ratelimit"]) == 0
    out = capsys.readouterr().out
    statuses = re.findall(r"(alice|bob) +GET /hello -> (\d+)", out)
    assert statuses == [
        ("alice", "200"),
        ("alice", "200"),
        ("alice", "200"),
        ("alice", "429"),
        ("bob", "200"),
        ("bob", "200"),
        ("alice", "200"),
    ]
    assert 'RateLimit-Policy: "burst";q=3;w=6, "minute";q=20;w=60' in out
    assert 'alice GET /hello -> 429  RateLimit: "burst";r=0;t=2' in out
    assert "Retry-After: 2   Cache-Control: no-store" in out
    assert "violated-policies: ['burst']" in out
