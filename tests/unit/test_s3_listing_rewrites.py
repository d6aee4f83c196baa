"""The fault proxy's listing rewrites write the same page the other valid ways they claim."""

from __future__ import annotations

from xml.etree import ElementTree

import pytest

from tests.rig import s3_listings

#: A URL-encoded page as ``weed mini`` writes it, two objects and a continuation token.
PAGE = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name>'
    b"<Prefix>statements%2F</Prefix><MaxKeys>2</MaxKeys><IsTruncated>true</IsTruncated>"
    b"<Contents><Key>statements/a%C2%85b%7Fc%0D+d%2B</Key><ETag>&#34;e1&#34;</ETag>"
    b"<LastModified>2026-10-18T03:00:00Z</LastModified></Contents>"
    b"<Contents><Key>statements/%01x</Key><ETag>&#34;e2&#34;</ETag>"
    b"<LastModified>2026-10-18T03:00:00Z</LastModified></Contents>"
    b"<NextContinuationToken>tok</NextContinuationToken>"
    b"<EncodingType>url</EncodingType><KeyCount>2</KeyCount></ListBucketResult>"
)


def test_a_page_rewritten_every_way_has_raw_escaped_keys_and_the_token_between():
    # When the page is rewritten all three ways
    page = s3_listings.rewrite(PAGE, s3_listings.REWRITES)

    # Then its keys are decoded and their controls written as numeric references, decimal
    # and hex in turn (one XML 1.0 cannot carry among them), with no EncodingType, and the
    # token and counts sit right after the first object
    assert page is not None
    assert b"<Key>statements/a&#133;b&#x7f;c&#13; d+</Key>" in page
    assert b"<Key>statements/&#x1;x</Key>" in page
    assert b"<Prefix>statements/</Prefix>" in page
    assert b"EncodingType" not in page
    first_end = page.index(b"</Contents>")
    assert page.index(b"<NextContinuationToken>tok<") == first_end + len(b"</Contents>") + len(
        b"<IsTruncated>true</IsTruncated>"
    )
    assert page.index(b"<KeyCount>") < page.index(b"<Contents>", first_end)


def test_without_escapes_the_page_is_still_xml_and_keeps_its_encoding():
    # When only the token moves
    page = s3_listings.rewrite(PAGE, {"token_between"})

    # Then the page is well-formed, URL-encoded as before, with the same elements
    assert page is not None
    root = ElementTree.fromstring(page)  # noqa: S314 - the test's own page
    names = sorted(child.tag.rpartition("}")[2] for child in root)
    assert names == sorted(
        child.tag.rpartition("}")[2]
        for child in ElementTree.fromstring(PAGE)  # noqa: S314 - the test's own page
    )
    assert b"statements/a%C2%85b%7Fc%0D+d%2B" in page


def test_an_unknown_rewrite_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown listing rewrites"):
        s3_listings.rewrite(PAGE, {"token_betwen"})


def test_a_body_that_is_not_a_listing_is_left_alone():
    assert s3_listings.rewrite(b"<Error><Code>SlowDown</Code></Error>", {"token_between"}) is None
    assert s3_listings.rewrite(b"not xml", {"token_between"}) is None
