"""Staging cuts batches at ``batch_size`` but never splits a group of keys over two."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from digest_cleanup.model.checkpoint import Stage
from digest_cleanup.pipeline import sweep_phases


class VersionedKind:
    """A kind whose keys ``name?versionId=v`` group by ``name``, as S3's do with all versions."""

    max_batch_size = 6

    def group(self, key: str) -> str:
        return key.partition("?")[0]


class PlainKind(VersionedKind):
    def group(self, key: str) -> str:
        return key


def _entries(*groups: tuple[str, int]) -> list[list[str]]:
    return [[f"{name}?versionId={v}", ""] for name, count in groups for v in range(count)]


def _stage(
    kind: Any, entries: list[list[str]], size: int, *, final: bool
) -> tuple[list[list[str]], list[str]]:
    """Run the sweep's staging on ``entries``: the batches staged, and the keys left over."""
    staged: list[list[list[str]]] = []

    def stage(*args: Any, **_: Any) -> int:
        staged.extend(args[-1])
        return len(staged)

    sweep = SimpleNamespace(
        cp=SimpleNamespace(stage=Stage(unbatched=list(entries))),
        target=SimpleNamespace(batch_size=size),
        kind=kind,
        run_id="run",
        stage=stage,
        store=SimpleNamespace(stage=stage),
    )
    sweep_phases._stage(sweep, final=final)  # type: ignore[arg-type]
    rest = [key for key, _ in sweep.cp.stage.unbatched]
    return [[key for key, _ in batch] for batch in staged], rest


def _groups(batches: list[list[str]]) -> list[list[str]]:
    return [sorted({key.partition("?")[0] for key in batch}) for batch in batches]


def test_a_group_at_a_batch_boundary_goes_whole_into_the_next_batch() -> None:
    # Given groups of 2, 2 and 2 keys and batches of 3
    entries = _entries(("a", 2), ("b", 2), ("c", 2))

    # When they are staged
    batches, rest = _stage(VersionedKind(), entries, 3, final=True)

    # Then no group is split, and no batch is larger than 3
    assert _groups(batches) == [["a"], ["b"], ["c"]]
    assert all(len(b) <= 3 for b in batches)
    assert rest == []


def test_the_open_batch_waits_for_the_next_page_and_keeps_its_groups_whole() -> None:
    # Given a full batch and a group that would not fit in it
    entries = _entries(("a", 1), ("b", 2), ("c", 2))

    # When a page is staged before the listing ends
    batches, rest = _stage(VersionedKind(), entries, 3, final=False)

    # Then the full batch is staged, and the open one waits for the next page
    assert _groups(batches) == [["a", "b"]]
    assert rest == ["c?versionId=0", "c?versionId=1"]


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        # larger than a batch: alone, up to the kind's limit
        (3, [["a"], ["big"], ["z"]]),
        # larger than the kind's limit: split in listing order, nothing else beside it
        (2, [["a"], ["big"], ["big"], ["z"]]),
    ],
)
def test_a_group_larger_than_a_batch_goes_alone(size: int, expected: list[list[str]]) -> None:
    entries = _entries(("a", 1), ("big", 5 if size == 3 else 8), ("z", 1))

    batches, _ = _stage(VersionedKind(), entries, size, final=True)

    assert _groups(batches) == expected
    assert all(len(b) <= VersionedKind.max_batch_size for b in batches)
    assert [k for b in batches for k in b] == [k for k, _ in entries]


def test_keys_of_a_kind_without_groups_are_cut_at_batch_size_as_before() -> None:
    entries = _entries(("a", 7))

    batches, rest = _stage(PlainKind(), entries, 3, final=False)
    assert ([len(b) for b in batches], len(rest)) == ([3, 3], 1)
    batches, rest = _stage(PlainKind(), entries, 3, final=True)
    assert ([len(b) for b in batches], rest) == ([3, 3, 1], [])
