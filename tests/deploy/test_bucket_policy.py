"""The AWS policy files agree with each other and with what the conditional-delete probe needs.

AWS is not reachable here and SeaweedFS enforces no policies, so these tests read the
files: the bucket policy that requires ``If-Match`` must deny exactly the deletes the IAM
policy grants to the same role, and the IAM policy must grant every request the probe
of a run's start sends, on the keys it sends them for.
"""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path
from typing import Any

import pytest

from digest_cleanup.kinds.s3_probe import probe_prefix
from digest_cleanup.targets import load_targets

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BUCKET_POLICY = DEPLOY / "aws" / "bucket-policy-require-if-match.json"
#: The requests the probe sends on each of its keys, by the IAM action that authorises them.
PROBE_OBJECT_ACTIONS = (
    "s3:PutObject",  # PutObject, and CreateMultipartUpload, UploadPart, CompleteMultipartUpload
    "s3:AbortMultipartUpload",  # an upload that failed halfway
    "s3:GetObject",  # AWS authorises an ETag condition only with it
    "s3:DeleteObject",  # DeleteObject and each key of DeleteObjects
    "s3:DeleteObjectVersion",  # its own versions and delete markers, in a versioned bucket
)
#: The listings the probe sends, with its key as the prefix.
PROBE_BUCKET_ACTIONS = ("s3:ListBucket", "s3:ListBucketVersions")


def _as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


@pytest.fixture(scope="module")
def iam() -> list[dict[str, Any]]:
    statements: list[dict[str, Any]] = json.loads((DEPLOY / "iam-policy.json").read_text())[
        "Statement"
    ]
    return statements


@pytest.fixture(scope="module")
def bucket_policy() -> dict[str, Any]:
    policy: dict[str, Any] = json.loads(BUCKET_POLICY.read_text())
    return policy


def _allows(iam: list[dict[str, Any]], action: str, arn: str, prefix: str | None = None) -> bool:
    """Whether an Allow grants ``action`` on ``arn`` (for a listing, with ``s3:prefix``)."""
    for statement in iam:
        if statement["Effect"] != "Allow" or action not in _as_list(statement["Action"]):
            continue
        if not any(fnmatch.fnmatchcase(arn, r) for r in _as_list(statement["Resource"])):
            continue
        patterns = statement.get("Condition", {}).get("StringLike", {}).get("s3:prefix")
        if patterns is None or (
            prefix is not None and any(fnmatch.fnmatchcase(prefix, p) for p in patterns)
        ):
            return True
    return False


def test_the_iam_policy_grants_every_request_of_the_probe(iam: list[dict[str, Any]]) -> None:
    # Given the compose stack's targets, and a probe key under each one's prefix
    for target in load_targets(ROOT / "compose" / "targets.toml"):
        bucket = target.options.bucket
        key = f"{probe_prefix(target.options)}0123456789abcdef"

        # Then every request the probe sends on that key is allowed
        for action in PROBE_OBJECT_ACTIONS:
            assert _allows(iam, action, f"arn:aws:s3:::{bucket}/{key}"), (target.name, action)
        for action in PROBE_BUCKET_ACTIONS:
            assert _allows(iam, action, f"arn:aws:s3:::{bucket}", prefix=key), (
                target.name,
                action,
            )


def test_the_probe_check_bites_on_a_key_outside_the_prefixes(iam: list[dict[str, Any]]) -> None:
    # Given a key outside every target prefix (where the probe used to write)
    outside = "arn:aws:s3:::digest-artifacts/.digest-cleanup-check-0123"

    # Then the policy grants nothing there, so the check above is not vacuous
    assert not _allows(iam, "s3:PutObject", outside)
    assert not _allows(iam, "s3:ListBucket", "arn:aws:s3:::digest-artifacts", ".digest-cleanup-")


def test_the_bucket_policy_denies_the_role_exactly_the_deletes_it_is_granted(
    iam: list[dict[str, Any]], bucket_policy: dict[str, Any]
) -> None:
    # Given the bucket policy's one statement
    assert bucket_policy["Version"] == "2012-10-17"
    (deny,) = bucket_policy["Statement"]

    # Then it is a Deny of s3:DeleteObject, the action the IAM policy grants the workers,
    # on exactly the resources that grant names, when s3:if-match is absent
    assert deny["Effect"] == "Deny"
    assert _as_list(deny["Action"]) == ["s3:DeleteObject"]
    granted = {
        r
        for s in iam
        if "s3:DeleteObject" in _as_list(s["Action"])
        for r in _as_list(s["Resource"])
    }
    assert set(_as_list(deny["Resource"])) == granted
    assert deny["Condition"] == {"Null": {"s3:if-match": "true"}}
    # and it leaves version deletes alone: a VersionId cannot go with If-Match
    assert "s3:DeleteObjectVersion" not in _as_list(deny["Action"])
    assert "NotAction" not in deny
    assert "NotPrincipal" not in deny


def test_the_bucket_policy_names_the_role_the_deploy_guide_attaches_the_iam_policy_to(
    bucket_policy: dict[str, Any],
) -> None:
    # Given the role the bucket policy denies, and the role the guide names
    (deny,) = bucket_policy["Statement"]
    principal = deny["Principal"]["AWS"]
    guide = (DEPLOY / "README.md").read_text()

    # Then they are one role, and the guide says what the policy does not cover
    assert re.fullmatch(r"arn:aws:iam::\d{12}:role/[\w+=,.@-]+", principal), principal
    assert f"`{principal}`" in guide
    assert "aws/bucket-policy-require-if-match.json" in guide
    assert "Enforce conditional deletes on Amazon S3 buckets" in guide
    assert "does not enforce bucket policies" in guide
