"""The guide shows the code the tests run, and its targets examples load.

``docs/adding-a-cleanup-task.md`` marks a code block with ``<!-- include: PATH -->``
when it is a file of this repository, verbatim, and a TOML block with
``<!-- check: targets -->`` when it is a targets file that must load as written.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from digest_cleanup.config.targets import parse_targets

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
        "tests/guide/test_guide_example.py",
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
