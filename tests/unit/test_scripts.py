"""The store's Lua files: each loads on a real Redis, its includes resolved, its names bound.

A script names its keys and arguments in its header and never indexes ``KEYS`` or
``ARGV`` by number, so the only order is the header's; a call that gives other
names fails before it reaches Redis.
"""

from __future__ import annotations

import re

import pytest
import redis

from digest_cleanup.model.run_view import SKIPPED_SHARE_EXCEEDED
from digest_cleanup.store import scripts
from digest_cleanup.store.scripts import Script, ScriptError, build
from digest_cleanup.targets import DEFAULT_MAX_SKIPPED_SHARE

SCRIPTS = [n for n in scripts.names() if not scripts.is_fragment(n)]
FRAGMENTS = [n for n in scripts.names() if scripts.is_fragment(n)]


def test_the_package_holds_scripts_and_the_fragments_they_include():
    # Every fragment is included by some script; none is loaded on its own
    assert len(SCRIPTS) >= 16
    included = {f for name in SCRIPTS for f in scripts.source(name).includes}
    assert included == set(FRAGMENTS)
    for fragment in FRAGMENTS:
        with pytest.raises(ScriptError, match="fragment"):
            scripts.source(fragment)


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_loads_on_redis_with_its_includes_resolved(redis_client, name):
    source = scripts.source(name)

    # SCRIPT LOAD compiles it: a syntax error, or an include left unresolved, fails here
    sha = redis_client.script_load(source.text)
    assert redis_client.script_exists(sha) == [True]
    assert "-- include:" not in source.text
    lines = set(source.text.splitlines())
    for fragment in source.includes:
        body = scripts.source_text(fragment).splitlines()
        assert {line for line in body if "-- include:" not in line} <= lines, fragment


@pytest.mark.parametrize("name", [*SCRIPTS, *FRAGMENTS])
def test_no_script_indexes_keys_or_argv_by_number(name):
    text = scripts.source_text(name)
    assert not re.search(r"KEYS\[", text), f"{name} reads KEYS by position"
    assert not re.search(r"ARGV\[\d", text), f"{name} reads ARGV by position"


def test_the_header_names_become_locals_in_their_order():
    source = build(
        "example.lua",
        "-- Example.\n-- KEYS: run lease\n-- ARGV: fence batches...\nreturn {run, lease, fence}",
    )
    assert source.keys == ("run", "lease")
    assert source.args == ("fence",)
    assert source.rest == "batches"
    assert source.text.splitlines()[:3] == [
        "local run, lease = KEYS[1], KEYS[2]",
        "local fence = ARGV[1]",
        "local batches_from = 2",
    ]


def test_a_call_orders_named_keys_and_refuses_wrong_names(redis_client: redis.Redis):
    # Given a script that returns what it was given
    echo = Script(
        redis_client,
        build(
            "echo.lua", "-- KEYS: b a\n-- ARGV: y x more...\nreturn {b, a, y, x, ARGV[more_from]}"
        ),
    )

    # When it is called with names in any order, Redis gets them in the header's order
    reply = echo(keys={"a": "key-a", "b": "key-b"}, args={"x": "1", "y": "2"}, rest=["3"])
    assert reply == [b"key-b", b"key-a", b"2", b"1", b"3"]

    # Then a missing or unknown name fails before anything is sent
    with pytest.raises(ScriptError, match=r"missing \['a'\]"):
        echo(keys={"b": "key-b"}, args={"x": "1", "y": "2"})
    with pytest.raises(ScriptError, match=r"not declared \['z'\]"):
        echo(keys={"a": "k", "b": "k"}, args={"x": "1", "y": "2", "z": "3"})


def test_a_fragment_goes_in_once_however_often_it_is_included():
    source = build(
        "twice.lua", "-- KEYS: run\n-- ARGV: now\n-- include: finish.lua\n-- include: finish.lua\n"
    )
    assert source.text.count("local function finish(") == 1


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("-- KEYS: run\n-- ARGV: run\n", "twice"),
        ("-- KEYS: type\n-- ARGV:\n", "cannot name a Lua local"),
        ("-- KEYS: run\n-- ARGV:\n-- include: run_fail.lua\n", "only fragments"),
        ("-- KEYS: run\n-- ARGV:\n-- include: nowhere.lua\n", "no Lua file"),
        # finish.lua defines ``local function finish``: it would shadow the argument
        ("-- KEYS: run\n-- ARGV: finish\n-- include: finish.lua\n", "a name of its header"),
    ],
)
def test_a_header_or_include_that_cannot_work_is_refused(text, problem):
    with pytest.raises(ScriptError, match=problem):
        build("bad.lua", text)


def test_the_finish_fragment_holds_the_python_defaults():
    # finish.lua cannot import them, so it spells them out; these are the Python values
    text = scripts.source_text("finish.lua")
    assert f"tonumber(h[8]) or {DEFAULT_MAX_SKIPPED_SHARE!r}\n" in text
    assert f"'reason', '{SKIPPED_SHARE_EXCEEDED}'" in text


def test_a_script_is_loaded_again_after_redis_forgets_it(redis_client: redis.Redis):
    # Given a registered script that ran once, and a Redis that lost its scripts (a restart)
    fail = Script(redis_client, "run_fail.lua")
    assert fail(keys={"run": "dc:run:none"}, args={"reason": "r", "message": "m", "now": "t"}) == 0
    redis_client.script_flush()

    # When it runs again, redis-py sends it whole after NOSCRIPT and it still answers
    assert fail(keys={"run": "dc:run:none"}, args={"reason": "r", "message": "m", "now": "t"}) == 0
