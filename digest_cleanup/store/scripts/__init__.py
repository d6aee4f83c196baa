"""The store's Lua scripts: one ``.lua`` file each in this package, called with named keys.

A script's header names the keys and arguments it takes, in the order Redis gets them::

    -- KEYS: run claims pending
    -- ARGV: claim attempt now batches...

The loader binds each name to a Lua local ahead of the script's first line
(``local run, claims, pending = KEYS[1], KEYS[2], KEYS[3]``), so a script says
``run``, never ``KEYS[1]``.  A last ``ARGV`` name ending in ``...`` stands for the
rest of the arguments, a list (``rest=`` in Python); the script reads them from
``ARGV[batches_from]`` on.

A line ``-- include: finish.lua`` is replaced by that file: a *fragment*, a file with
no ``KEYS`` line, that defines the functions several scripts share.  Each fragment
goes into a script once, however many of its includes name it; a fragment may
include others.  Nothing is pasted together in Python.

:class:`Script` registers one on a client with redis-py's ``register_script``: it is
sent by its hash, and sent whole again when Redis answers NOSCRIPT (after a restart
or a ``SCRIPT FLUSH``).  Callers pass keys and arguments by name, and the header
orders them (see :meth:`Script.__call__`), so no positional list is spread over
functions.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

import redis

#: What an argument may be: redis-py encodes each to bytes.
Arg = str | int | float | bytes
#: Lua's keywords and the globals the scripts call, which no header name may shadow.
# fmt: off
RESERVED = frozenset({
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in",
    "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while", "redis",
    "cjson", "cmsgpack", "bit", "struct", "math", "string", "table", "tonumber", "tostring",
    "type", "pairs", "ipairs", "unpack", "next", "pcall", "error", "assert", "select", "KEYS",
    "ARGV",
})
# fmt: on

_NAME = re.compile(r"[a-z_][a-z0-9_]*\Z")
_HEADER = re.compile(r"--\s*(KEYS|ARGV):(.*)")
_INCLUDE = re.compile(r"--\s*include:\s*(\S+)\s*\Z")
#: A local a fragment defines at its top level: ``local NAME`` or ``local function NAME``.
_TOP_LEVEL_LOCAL = re.compile(r"^local (?:function )?([A-Za-z_][A-Za-z0-9_]*)", re.M)


class ScriptError(ValueError):
    """A script file, or a call of one, that does not match what its header declares."""


@dataclasses.dataclass(frozen=True)
class Source:
    """One script as Redis runs it: its header's names and its text, includes resolved."""

    name: str
    keys: tuple[str, ...]
    args: tuple[str, ...]
    #: The ``ARGV`` name that takes the rest of the arguments, if the header ends with one.
    rest: str | None
    #: The fragments the text took in, in the order they went in.
    includes: tuple[str, ...]
    text: str


def names() -> list[str]:
    """Every ``.lua`` file of the package, scripts and fragments, by file name."""
    files = resources.files(__name__)
    return sorted(p.name for p in files.iterdir() if p.name.endswith(".lua"))


def source_text(name: str) -> str:
    """The file ``name`` as it is in the package, includes and all."""
    try:
        return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScriptError(f"no Lua file {name!r} in {__name__}") from None


def _header(name: str, text: str) -> dict[str, list[str]]:
    """The ``KEYS`` and ``ARGV`` lines of the leading comment block, split into names."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("--"):
            break
        match = _HEADER.match(line)
        if match:
            if match[1] in found:
                raise ScriptError(f"{name}: two {match[1]} lines")
            found[match[1]] = match[2].split()
    return found


def _resolve(name: str, text: str, seen: set[str], order: list[str]) -> str:
    """``text`` with every include line replaced by its fragment (once per script)."""
    out = []
    for line in text.splitlines():
        match = _INCLUDE.match(line.strip())
        if not match:
            out.append(line)
            continue
        fragment = match[1]
        if fragment in seen:
            continue
        seen.add(fragment)
        body = source_text(fragment)
        if "KEYS" in _header(fragment, body):
            raise ScriptError(f"{name} includes {fragment}, a script: only fragments go in")
        out.append(_resolve(fragment, body, seen, order))
        order.append(fragment)
    return "\n".join(out)


def _names(name: str, header: dict[str, list[str]]) -> tuple[list[str], list[str], str | None]:
    keys, args = header["KEYS"], header.get("ARGV", [])
    rest = args.pop()[:-3] if args and args[-1].endswith("...") else None
    every = [*keys, *args, *([rest] if rest else [])]
    for each in every:
        if not _NAME.match(each) or each in RESERVED:
            raise ScriptError(f"{name}: {each!r} cannot name a Lua local")
    if len(set(every)) != len(every):
        raise ScriptError(f"{name}: a name appears twice in KEYS and ARGV")
    return keys, args, rest


@functools.cache
def source(name: str) -> Source:
    """The script file ``name`` (such as ``run_record.lua``), ready to load."""
    return build(name, source_text(name))


def build(name: str, text: str) -> Source:
    """The script ``text`` ready to load: names bound, includes resolved from the package."""
    header = _header(name, text)
    if "KEYS" not in header:
        raise ScriptError(f"{name} is a fragment (no KEYS line): include it in a script")
    keys, args, rest = _names(name, header)
    order: list[str] = []
    body = _resolve(name, text, {name}, order)
    # A fragment's top-level local sits after the header's names and would silently
    # shadow one of them for the rest of the script.
    every = {*keys, *args, *([f"{rest}_from"] if rest else [])}
    for fragment in order:
        clash = every & set(_TOP_LEVEL_LOCAL.findall(source_text(fragment)))
        if clash:
            raise ScriptError(f"{name}: {fragment} defines {sorted(clash)}, a name of its header")
    bindings = [
        f"local {', '.join(names)} = {', '.join(f'{table}[{i}]' for i in range(1, len(names) + 1))}"
        for table, names in (("KEYS", keys), ("ARGV", args))
        if names
    ]
    if rest:
        bindings.append(f"local {rest}_from = {len(args) + 1}")
    return Source(name, tuple(keys), tuple(args), rest, tuple(order), "\n".join([*bindings, body]))


def is_fragment(name: str) -> bool:
    return "KEYS" not in _header(name, source_text(name))


class Script:
    """One script registered on a client, called with its keys and arguments by name."""

    def __init__(self, client: redis.Redis, name: str | Source) -> None:
        self.source = source(name) if isinstance(name, str) else name
        self._script = client.register_script(self.source.text)

    def __call__(
        self,
        *,
        keys: Mapping[str, str],
        args: Mapping[str, Arg],
        rest: Sequence[Arg] = (),
    ) -> Any:
        """Run the script; ``keys`` and ``args`` give exactly the header's names.

        ``rest`` is the list the header's last ``name...`` stands for; a script whose
        header has none takes no ``rest``.  A wrong name is a :class:`ScriptError`
        before anything reaches Redis.
        """
        src = self.source
        _check(src.name, "KEYS", src.keys, keys)
        _check(src.name, "ARGV", src.args, args)
        if rest and not src.rest:
            raise ScriptError(f"{src.name}: its header takes no rest of arguments")
        ordered = [*(args[a] for a in src.args), *rest]
        return self._script(keys=[keys[k] for k in src.keys], args=ordered)


def _check(script: str, table: str, declared: Sequence[str], given: Mapping[str, Any]) -> None:
    if given.keys() != set(declared):
        missing = sorted(set(declared) - given.keys())
        unknown = sorted(given.keys() - set(declared))
        raise ScriptError(f"{script}: {table} missing {missing}, not declared {unknown}")
