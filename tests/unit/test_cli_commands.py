"""Every command is registered one way and named one way, and takes ``--json``."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Iterator

import pytest

import digest_cleanup.cli
from digest_cleanup.cli import build_parser

#: Modules of the CLI that register no command.
SHARED = {"context", "__main__"}
#: Commands registered by a module named after another command (the list beside its item).
LISTED_WITH = {"runs": "status"}


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every runnable command as (``dlq list``, its parser); groups such as ``dlq`` are not."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups and path:
        yield " ".join(path), parser
    for group in groups:
        for name, sub in group.choices.items():
            yield from _commands(sub, (*path, name))


COMMANDS = dict(_commands(build_parser()))


def test_the_parser_has_every_command_operators_use():
    # Given the parser, then every command the docs and deployment files name is on it
    assert set(COMMANDS) == {
        "targets",
        "run",
        "status",
        "runs",
        "abort",
        "report",
        "verify",
        "check",
        "metrics",
        "plan",
        "console",
        "dlq list",
        "dlq show",
        "dlq redrive",
        "dlq purge",
    }


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_is_bound_to_a_handler_named_after_it_in_the_module_named_after_it(command):
    # Given a command's parser, when its defaults are read
    handler = COMMANDS[command].get_default("handler")

    # Then its handler is <command>_command, in cli/<first word of the command>.py
    assert handler.__name__ == command.replace(" ", "_") + "_command"
    first = command.split()[0]
    assert handler.__module__ == f"digest_cleanup.cli.{LISTED_WITH.get(first, first)}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_takes_json(command):
    args = build_parser().parse_args([*command.split(), "--json", *_required(command)])
    assert args.json is True
    assert args.command == command


def _required(command: str) -> list[str]:
    """Just enough arguments for ``command`` to parse."""
    positional = [
        "x"
        for a in COMMANDS[command]._actions
        if not a.option_strings and a.nargs is None and a.required
    ]
    options = {"plan": ["--artifacts", "1", "--window", "1h"], "abort": ["--reason", "x"]}
    return positional + options.get(command, [])


def test_every_command_module_registers_through_one_register_function():
    # Given the modules of the CLI, then each one that is not shared exposes register()
    names = {m.name for m in pkgutil.iter_modules(digest_cleanup.cli.__path__)} - SHARED
    for name in sorted(names):
        module = importlib.import_module(f"digest_cleanup.cli.{name}")
        assert callable(getattr(module, "register", None)), f"cli/{name}.py has no register()"
    # and every one of them registers something
    registering = {
        COMMANDS[c].get_default("handler").__module__.rsplit(".", 1)[1] for c in COMMANDS
    }
    assert registering == names
