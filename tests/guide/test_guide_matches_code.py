"""The guide shows the code the tests run, and says what the code does.

``docs/adding-a-cleanup-task.md`` marks a code block with ``<!-- include: PATH -->``
when it is a file of this repository, verbatim, and a TOML block with
``<!-- check: targets -->`` when it is a targets file that must load as written.
Its tables and rules are read against the code, so neither drifts from the other:
every member of ``TargetKind`` with its signature, every reserved target field, the
layout test's limits and the layers a kind may import, and the built-in kinds.
"""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path

import pytest

from digest_cleanup.kinds import BUILTIN_KINDS, ENTRY_POINT_GROUP, TargetKind
from digest_cleanup.targets import COMMON_FIELDS, parse_targets
from tests.unit.test_layout import FUNCTION_LINES, LAYERS, MODULE_LINES, REASON

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "adding-a-cleanup-task.md"
#: A marker comment, then the fenced block right below it.
MARKED_BLOCK = re.compile(
    r"<!-- (?P<marker>include|check): (?P<arg>\S+) -->\n```(?P<lang>\w+)\n(?P<body>.*?)^```$",
    re.DOTALL | re.MULTILINE,
)


def _blocks(marker: str) -> list[re.Match[str]]:
    return [m for m in MARKED_BLOCK.finditer(GUIDE.read_text()) if m["marker"] == marker]


def test_the_guide_includes_the_example_kind_and_its_tests() -> None:
    assert [m["arg"] for m in _blocks("include")] == [
        "tests/guide/redis_keys_kind.py",
        "tests/guide/localdir_package/localdir_cleanup/kind.py",
        "tests/guide/test_guide_example.py",
        "tests/guide/localdir_package/tests/test_localdir.py",
    ]


@pytest.mark.parametrize("block", _blocks("include"), ids=lambda m: m["arg"])
def test_an_included_block_is_the_file_verbatim(block: re.Match[str]) -> None:
    # A differing block means the guide and the tested code have drifted apart:
    # paste the file into the block again.
    assert block["body"] == (ROOT / block["arg"]).read_text()


def test_the_guide_has_targets_examples_to_check() -> None:
    assert len(_blocks("check")) >= 2


@pytest.mark.parametrize("block", _blocks("check"), ids=lambda m: m["body"].split("]")[0])
def test_a_targets_example_in_the_guide_loads(block: re.Match[str]) -> None:
    assert block["lang"] == "toml"
    targets = parse_targets(block["body"])
    assert len(targets) == 1


def _members() -> list[str]:
    """Every member a kind may set or override: ``TargetKind``'s public names and ``__init__``."""
    names = {n for n in vars(TargetKind) if not n.startswith("_")} | set(TargetKind.__annotations__)
    return sorted(names | {"__init__"})


def _as_written(name: str) -> str:
    """How the guide's member table writes ``name``: with its parameters if it is called."""
    raw = inspect.getattr_static(TargetKind, name, None)  # None: only annotated (name, Options)
    if not (inspect.isfunction(raw) or isinstance(raw, classmethod)):
        return name  # a class attribute or a property
    params = list(inspect.signature(getattr(TargetKind, name)).parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    shown = [p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in params]
    suffix = " *classmethod*" if isinstance(raw, classmethod) else ""
    return f"{name}({', '.join(shown)})`{suffix}"


@pytest.mark.parametrize("member", _members())
def test_the_member_table_shows_every_member_with_its_signature(member: str) -> None:
    # A missing row is a hook the guide does not teach; a differing one has drifted
    written = _as_written(member)
    row = f"| `{written}" + ("" if written.endswith(("`", "*")) else "`") + " |"
    assert row in GUIDE.read_text(), f"the guide's member table lacks the row {row!r}"


def test_the_member_table_names_nothing_the_seam_lacks() -> None:
    rows = re.findall(r"^\| `([A-Za-z_]+)[`(]", GUIDE.read_text(), re.MULTILINE)
    table = rows[rows.index("name") :]  # the member table starts with `name`
    members = set(_members())

    assert [r for r in table if r in members] == table[: len(members)]
    assert set(table[: len(members)]) == members


@pytest.mark.parametrize("field", sorted(COMMON_FIELDS))
def test_every_reserved_field_has_a_row_in_the_guide(field: str) -> None:
    assert f"| `{field}` |" in GUIDE.read_text()


def test_the_guide_states_the_layout_limits_the_layout_test_enforces() -> None:
    text = " ".join(GUIDE.read_text().split())

    assert f"A module over {MODULE_LINES} lines, or a function over {FUNCTION_LINES}" in text
    assert f'"{REASON}"' in text


def test_the_guide_names_exactly_the_layers_a_kind_may_import() -> None:
    # Given the layout test's layers below and at the kinds' own
    kinds = LAYERS["kinds"]
    allowed = {f"digest_cleanup.{p}" for p, layer in LAYERS.items() if p and layer <= kinds}
    text = " ".join(GUIDE.read_text().split())
    start = text.index(f"A kind is layer {kinds}: it may import")
    rule = text[start : text.index("and nothing above them", start)]

    # Then the rule names each of them, and no other module
    assert set(re.findall(r"`(digest_cleanup[\w.]*)`", rule)) == allowed


def test_the_built_in_kinds_are_the_entry_points_the_project_declares() -> None:
    # An in-repo kind goes in BUILTIN_KINDS, and beside the others in pyproject.toml
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    assert project["entry-points"][ENTRY_POINT_GROUP] == BUILTIN_KINDS
