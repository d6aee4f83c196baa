"""The seam's declarations a kind makes: a path-like namespace, log prefixes, field names."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from datetime import datetime

import pytest

from digest_cleanup.errors import TargetsFileError
from digest_cleanup.kinds import KeyResult, Namespace, Page, TargetKind
from digest_cleanup.logs import Scrubber, item_prefixes, redact
from digest_cleanup.settings import Settings
from digest_cleanup.targets import COMMON_FIELDS, parse_targets

SETTINGS = Settings(log_hash_key="k" * 32)


@dataclasses.dataclass(frozen=True)
class FolderOptions:
    directory: str


class FolderKind(TargetKind):
    """A kind whose namespace is a path, compared by segment."""

    name = "folder"
    Options = FolderOptions

    @classmethod
    def namespace(cls, options: FolderOptions) -> Namespace:
        return Namespace("file://", options.directory, separator="/")

    def scan(self, cutoff: datetime, start_after: str | None = None) -> Iterator[Page]:
        yield from ()

    def delete(
        self, keys: Sequence[str], cutoff: datetime, conditions: Sequence[str] = ()
    ) -> list[KeyResult]:
        return []

    def out_of_scope(self, key: str) -> str | None:
        return None

    def describe(self) -> str:
        return self.options.directory


@dataclasses.dataclass(frozen=True)
class ClashingOptions:
    directory: str
    description: str = ""


class ClashingKind(FolderKind):
    """A kind whose own field takes a name every target has."""

    Options = ClashingOptions


def _folder(name: str, directory: str, kind: str = "FolderKind", *extra: str) -> str:
    lines = [f"[targets.{name}]", f'kind = "{__name__}:{kind}"', f'directory = "{directory}"']
    lines += ["retention_days = 7", 'schedule = "0 3 * * 0"', *extra]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("a", "b"),
    [("/data/a", "/data/ab"), ("/data/a/", "/data/ab"), ("/data/a", "/data/a-old/")],
)
def test_path_like_namespaces_whose_names_share_a_start_do_not_overlap(a: str, b: str) -> None:
    # Given two directories that are siblings, however their names begin
    text = _folder("first", a) + _folder("second", b)

    # When the file loads, then both targets stand
    assert sorted(parse_targets(text).by_name) == ["first", "second"]


@pytest.mark.parametrize(
    ("a", "b"), [("/data/a", "/data/a/2026"), ("/data/a", "/data/a/"), ("/data", "/data/a")]
)
def test_a_directory_inside_another_overlaps_it(a: str, b: str) -> None:
    with pytest.raises(TargetsFileError, match=r"targets\.first and targets\.second overlap"):
        parse_targets(_folder("first", a) + _folder("second", b))


def test_a_plain_namespace_still_compares_as_a_string() -> None:
    # A raw S3 prefix really does share keys with its sibling: no separator, no segments
    assert Namespace("s3://b", "statements").overlaps(Namespace("s3://b", "statements-old/"))
    assert not Namespace("s3://b", "a/").overlaps(Namespace("s3://c", "a/"))
    assert Namespace("file://", "/data/a", "/").folder == "/data/a/"
    assert Namespace.of(("s3://b", "p/")) == Namespace("s3://b", "p/")


def test_a_kind_s_field_named_like_a_common_field_is_refused() -> None:
    with pytest.raises(TargetsFileError) as refused:
        parse_targets(_folder("first", "/data/a", "ClashingKind"))

    message = str(refused.value)
    assert message.startswith("targets.first.kind: ")
    assert "'description'" in message
    assert all(field in message for field in COMMON_FIELDS)


def test_log_prefixes_default_to_the_namespace_s_prefix() -> None:
    targets = parse_targets(_folder("first", "/data/a") + _folder("second", "/data/b"))

    assert item_prefixes(targets) == ["/data/a", "/data/b"]
    assert TargetKind.log_prefixes(FolderOptions("/x")) == ()  # the base kind: no namespace


@dataclasses.dataclass(frozen=True)
class PrefixOptions:
    prefix: str


def test_without_a_namespace_an_option_named_prefix_is_what_logs_may_show() -> None:
    # A kind written before log_prefixes() existed, whose keys start with its prefix
    # option, keeps its keys redacted
    assert TargetKind.log_prefixes(PrefixOptions("sessions/")) == ("sessions/",)
    assert TargetKind.log_prefixes(PrefixOptions("")) == ()


def test_the_scrubber_keeps_the_declared_part_and_hashes_the_rest() -> None:
    # Given keys with no '/' after their fixed part, and keys under a directory
    scrub = Scrubber(SETTINGS, ["session:", "/data/a"])

    # When lines that name them are scrubbed
    one = scrub("expired session:cust-42 and /data/a/2026-11-22/cust-42.pdf")

    # Then the declared part and the folders stay, and the customer is hashed
    assert "cust-42" not in one
    assert one.startswith("expired session:h:")
    assert "/data/a/2026-11-22/h:" in one
    assert scrub(one) == one
    assert scrub("in /data/a") == "in /data/a"  # the prefix alone is no customer


def test_redact_never_hashes_inside_the_kept_part() -> None:
    # A segment chosen by CLEANUP_LOG_HASH_SEGMENT that lies inside the kept part stays
    first = Settings(log_hash_key="k" * 32, log_hash_segment=0)

    assert redact("statements/x/cust.pdf", first, keep="statements/") == "statements/x/cust.pdf"
    assert redact("statements/x/cust.pdf", first).startswith("h:")
