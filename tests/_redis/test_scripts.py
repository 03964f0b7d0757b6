"""How a script call's error replies move it on (``_redis.scripts.resend_stage``)."""

from __future__ import annotations

import pytest

from headway._redis.resp import reply_error
from headway._redis.scripts import EVAL, EVALSHA, FCALL, LOAD, Script, resend_stage

# Error replies as Redis 6 and 7 write them (without the leading "-").
NOT_FOUND = "ERR Function not found"
NO_FCALL = "NOPERM this user has no permissions to run the 'fcall' command"
NO_FCALL_72 = "NOPERM User app has no permissions to run the 'fcall' command"
UNKNOWN = "ERR unknown command 'FCALL', with args beginning with: 'headway_x' '1' "
UNKNOWN_6 = "ERR unknown command `FCALL`, with args beginning with: `headway_x`, `1`, "
NOSCRIPT = "NOSCRIPT No matching script. Please use EVAL."
# Errors raised inside a script: it ran (what it wrote before stays), so never resent.
IN_SCRIPT = [
    "ERR The user executing the script can't run this command or subcommand script: "
    "headway_x, on @user_function:5.",
    "ERR ACL failure in script: User app has no permissions to run the 'time' command "
    "script: headway_x, on @user_function:3.",
    "ERR ACL failure in script: No permissions to access a key script: headway_x, "
    "on @user_function:9.",
    "ERR user_function:4: unknown command 'function' script: headway_x, on @user_function:4.",
    "ERR Error running script (call to f_x): @user_script:1: Function not found",
    "BOOM went the script",
]


@pytest.mark.parametrize(
    ("stage", "reply", "then"),
    [
        (FCALL, NOT_FOUND, LOAD),
        (LOAD, NOT_FOUND, EVALSHA),  # loaded, still missing: the load was refused
        (FCALL, NO_FCALL, EVALSHA),
        (FCALL, NO_FCALL_72, EVALSHA),
        (FCALL, UNKNOWN, EVALSHA),
        (FCALL, UNKNOWN_6, EVALSHA),
        (EVALSHA, NOSCRIPT, EVAL),
        (EVAL, NOSCRIPT, None),
        (EVALSHA, NOT_FOUND, None),
        *((stage, error, None) for error in IN_SCRIPT for stage in (FCALL, LOAD, EVALSHA)),
    ],
)
def test_only_a_call_that_did_not_run_is_sent_again(stage: int, reply: str, then: int) -> None:
    assert resend_stage(stage, reply_error(reply)) == then


def test_a_library_is_named_after_its_whole_text() -> None:
    body = "return 1"
    alone = Script.from_source("one", f"local x = 1\n{body}")
    split = Script.__new__(Script)
    split._set("one", "local x = 1", body)  # the same EVAL source, another library
    freeing = Script.__new__(Script)
    freeing._set("one", "local x = 1", body, allow_oom=True)
    assert alone.sha == split.sha == freeing.sha
    assert len({alone.function, split.function, freeing.function}) == 3
    assert "flags={'allow-oom'}" in freeing.library
