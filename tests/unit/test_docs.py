"""The docs match the tree: the module map, the layer picture, the links, the settings.

``docs/architecture.md``'s module map has a ``### `PACKAGE/` `` heading for every package
of ``digest_cleanup/`` (every directory with an ``__init__.py``) and, under
``### `digest_cleanup/` ``, a table row for every top-level module; every module it names
exists.  The layer picture in the README and in the architecture page lists the layers of
``tests/unit/test_layout.py`` in the same order.  Every relative link in the README and
``docs/`` reaches a file (and a heading, when it names one), the README stays short, and
the configuration page documents every variable and targets-file field the code reads.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path

import pytest

import digest_cleanup
from digest_cleanup.kinds import load_kind
from digest_cleanup.targets import COMMON_FIELDS, parse_targets
from tests.unit.test_layout import LAYERS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(digest_cleanup.__file__).parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.md"
CONFIGURATION = DOCS / "configuration.md"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
#: What the README may weigh: a page that leads, with the rest in docs/.
README_MAX_BYTES = 16 * 1024
#: The name the layer picture gives the package itself (LAYERS' empty prefix).
PACKAGE_ROW = "digest_cleanup"

FENCE = re.compile(r"^```.*?^```$", re.MULTILINE | re.DOTALL)
#: ``  9 | tasks  app  broker |  a note``: a layer's number, then its names inside the box.
PICTURE_ROW = re.compile(r"^\s*(?P<layer>\d+) \|(?P<names>[^|]+)\|", re.MULTILINE)
SECTION = re.compile(r"^### `(?P<path>[^`]+)`", re.MULTILINE)
MODULE_ROW = re.compile(r"^\| `(?P<module>[^`]+\.py)` \|", re.MULTILINE)
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)\)")
CODE_SPAN = re.compile(r"`[^`\n]+`")
HEADING = re.compile(r"^#{1,6} (?P<title>.+)$", re.MULTILINE)
VARIABLE = re.compile(r"\bCLEANUP_[A-Z0-9_]*[A-Z0-9]\b")


def _prose(text: str) -> str:
    """The text outside fenced blocks, which hold examples rather than links or headings."""
    return FENCE.sub("", text)


def _picture(path: Path) -> list[tuple[int, str]]:
    """``(layer, name)`` of the layer picture in ``path``, bottom first, left to right."""
    rows = [(int(m["layer"]), m["names"].split()) for m in PICTURE_ROW.finditer(path.read_text())]
    return [(layer, name) for layer, names in reversed(rows) for name in names]


def _module_map() -> dict[str, list[str]]:
    """Each ``### `PATH/` `` section of the map, with the modules its table names."""
    text = ARCHITECTURE.read_text()
    heads = list(SECTION.finditer(text))
    return {
        head["path"]: MODULE_ROW.findall(text, head.end(), nxt.start() if nxt else len(text))
        for head, nxt in zip(heads, [*heads[1:], None], strict=True)
    }


def _packages() -> list[str]:
    return sorted(
        f"{p.parent.relative_to(PACKAGE).as_posix()}/"
        for p in PACKAGE.rglob("__init__.py")
        if p.parent != PACKAGE
    )


def _slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: Counter[str] = Counter()
    found = set()
    for m in HEADING.finditer(_prose(path.read_text())):
        slug = _slug(m["title"])
        found.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
        seen[slug] += 1
    return found


def _links(path: Path) -> list[str]:
    prose = CODE_SPAN.sub("", _prose(path.read_text()))
    return [m["target"] for m in LINK.finditer(prose)]


def test_the_module_map_has_a_section_for_every_package() -> None:
    # Given the packages of the tree, and the sections of the map
    sections = _module_map()

    # Then each package has its section, and each section is a package
    missing = [p for p in _packages() if p not in sections]
    assert not missing, f"docs/architecture.md's module map lacks a section for {missing}"
    stale = [s for s in sections if s != "digest_cleanup/" and s not in _packages()]
    assert not stale, f"docs/architecture.md's module map names packages that are gone: {stale}"


def test_the_module_map_names_every_top_level_module() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))

    named = _module_map().get("digest_cleanup/", [])

    assert sorted(named) == top, (
        "the `digest_cleanup/` table of docs/architecture.md's module map names "
        f"{sorted(named)}; the package's top holds {top}"
    )


def test_every_module_the_map_names_exists() -> None:
    stale = [
        f"{section}{module}"
        for section, modules in _module_map().items()
        for module in modules
        if not (PACKAGE / section.removeprefix("digest_cleanup/") / module).is_file()
    ]

    assert not stale, f"docs/architecture.md's module map names modules that are gone: {stale}"


@pytest.mark.parametrize("path", [README, ARCHITECTURE], ids=lambda p: p.name)
def test_the_layer_picture_is_the_layout_tests_layers_in_order(path: Path) -> None:
    # Given the layers the layout test enforces, bottom first
    expected = [(layer, prefix or PACKAGE_ROW) for prefix, layer in LAYERS.items()]

    # When the picture is read from the bottom row up, each row left to right
    drawn = _picture(path)

    # Then it names the same layers, at the same numbers, in the same order
    assert drawn == expected


def test_the_readme_leads_and_stays_short() -> None:
    size = len(README.read_bytes())

    assert size < README_MAX_BYTES, f"README.md is {size} bytes; move detail to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_reaches_a_file_and_heading(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto: and the like are not files of this repository
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")

    assert not broken, f"{page.name}: {broken}"


def test_the_link_check_sees_a_broken_link_and_a_missing_heading(tmp_path: Path) -> None:
    # The checks above read real pages; these are their parts on made-up ones
    (tmp_path / "a.md").write_text("# Top\n\n## The env file\n\n```\n## Not a heading\n```\n")

    assert _anchors(tmp_path / "a.md") == {"top", "the-env-file"}
    assert _slug("Trying it locally: `make demo`") == "trying-it-locally-make-demo"
    page = tmp_path / "b.md"
    page.write_text("[x](a.md#top) `[y](gone.md)` and [z](gone.md)\n```\n[w](gone.md)\n```\n")
    assert _links(page) == ["a.md#top", "gone.md"]


def test_every_variable_the_code_reads_is_documented() -> None:
    # Given every CLEANUP_* name in the package's source
    read = {v for p in PACKAGE.rglob("*.py") for v in VARIABLE.findall(p.read_text())}
    documented = set(VARIABLE.findall(CONFIGURATION.read_text()))

    # Then the configuration page documents each of them
    assert read, "the scan found no variable at all"
    assert not read - documented, f"docs/configuration.md lacks {sorted(read - documented)}"


@pytest.mark.parametrize("kind", ["s3", "postgres"])
def test_every_targets_file_field_is_documented(kind: str) -> None:
    fields = set(COMMON_FIELDS) | {f.name for f in dataclasses.fields(load_kind(kind).Options)}
    text = CONFIGURATION.read_text()

    undocumented = sorted(f for f in fields if f"| `{f}` |" not in text)

    assert not undocumented, f"docs/configuration.md has no table row for {undocumented}"


@pytest.mark.parametrize("page", [README, CONFIGURATION], ids=lambda p: p.name)
def test_every_targets_example_loads(page: Path) -> None:
    blocks = re.findall(r"^```toml\n(.*?)^```$", page.read_text(), re.MULTILINE | re.DOTALL)

    assert blocks
    for block in blocks:
        assert parse_targets(block).by_name
