"""Cutting expired keys into batches: at ``batch_size``, never one group over two.

A kind's :meth:`~digest_cleanup.kinds.base.TargetKind.group` says which keys must
be deleted by one call (a versioned S3 key's versions and delete markers, whose
order matters); the sweep stages its batches through :func:`cut_batches`.
"""

from __future__ import annotations

import itertools

from digest_cleanup.kinds import TargetKind
from digest_cleanup.model.checkpoint import Expired


def cut_batches(
    entries: list[Expired], size: int, kind: TargetKind, *, final: bool
) -> tuple[list[list[Expired]], list[Expired]]:
    """Cut ``entries`` into batches of ``size``, never one group over two; return the rest.

    A group (:meth:`~digest_cleanup.kinds.base.TargetKind.group`: a versioned S3
    key's versions and markers) that does not fit closes the batch and starts the
    next.  One larger than ``size`` goes alone in a batch of up to the kind's
    ``max_batch_size``; past that it is split in order (an S3 key's markers come
    last), and the kind holds the markers back while a version stays.  The rest is
    the open batch, staged by a later call, or now when ``final``.
    """
    batches: list[list[Expired]] = []
    current: list[Expired] = []
    for _, members in itertools.groupby(entries, key=lambda entry: kind.group(entry[0])):
        group = list(members)
        if current and len(current) + len(group) > size:
            batches.append(current)
            current = []
        if len(group) > size:
            limit = kind.max_batch_size
            batches.extend(group[i : i + limit] for i in range(0, len(group), limit))
            continue
        current.extend(group)
        if len(current) == size:
            batches.append(current)
            current = []
    if final and current:
        batches.append(current)
        current = []
    return batches, current
