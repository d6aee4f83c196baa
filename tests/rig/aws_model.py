"""A model of AWS S3's request-rate limit and latency, as a proxy in front of ``weed mini``.

``weed mini`` answers every request at once and never says SlowDown, so a
pipeline tuned against it alone can be tuned for a server that does not exist.
:class:`AwsModel` is a rule set on :class:`~tests.rig.proxy.ReverseProxy`
that makes ``weed mini`` behave, for writes, like S3 does::

    with AwsModel(weed.endpoint_url) as aws:
        started = time.monotonic()
        run_cleanup(endpoint_url=aws.endpoint_url)
        assert aws.throttled_share() < 0.01
        print(aws.accepted_rate(started, time.monotonic()), aws.throttles_by_form())

What AWS documents, and the model follows:

* S3 serves at least 3,500 PUT/COPY/POST/DELETE requests per second per
  partitioned prefix (5,500 GET/HEAD).
* Each key of a DeleteObjects counts as one write against that budget, not the
  request as a whole (Hadoop S3A's BulkDelete javadoc, HADOOP-17935).
* Over the budget, S3 answers SlowDown in three forms: a ``503`` with an
  ``<Error><Code>SlowDown</Code>`` body; a ``200`` whose whole body is that
  ``<Error>`` document; or a normal ``200`` DeleteResult with per-key ``SlowDown``
  ``<Error>`` entries for the keys it did not delete.
* S3 itself sends no Retry-After.

The model:

* **Write budget.**  One token bucket per partition (:class:`WriteBudget`),
  refilled at ``write_rate`` tokens a second up to ``write_rate * burst_seconds``
  (short bursts are allowed), full at the start.  So any ``w`` seconds may accept
  up to ``write_rate * (burst_seconds + w)`` keys of one partition (7,000 in one
  second by default), while a long run averages at most ``write_rate`` a second.
  A partition is the bucket and the key's first path segment up to and including
  its first ``/`` (``("b", "statements/")``); a key without ``/`` is in the
  bucket-level partition ``("b", "")``.  Real S3 splits prefixes by itself, and
  slowly, as load grows; a fixed first-segment partition is an assumption.  Every
  key of a DeleteObjects costs one token in its partition; a DeleteObject, a PUT
  (COPY is a PUT) and a POST to a key cost one.  GET, HEAD and list are not
  limited: their 5,500/s is not modelled.
* **Over budget.**  A DeleteObjects that lacks a token for any of its keys is
  throttled in one of the ``forms``, drawn uniformly with ``random.Random(seed)``:
  ``"503"`` and ``"200"`` answer SlowDown without forwarding; ``"per_key"``
  forwards as many keys of each partition as it has tokens for (the first ones,
  in the body's order) and adds a per-key SlowDown entry for each of the rest to
  the upstream's DeleteResult, or answers a DeleteResult of only those entries when
  no key has a token.  Throttled keys take no tokens.  A throttled single write
  gets the ``503``.  With ``retry_after_ms`` every throttled answer carries
  ``x-amz-retry-after`` (the header newer AWS SDKs read); by default there is none,
  as from S3.  :meth:`AwsModel.force_throttle` throttles the next DeleteObjects
  requests whatever the budget holds.
* **Latency** (``latency=True``).  Before a request is forwarded or answered, the
  proxy waits a draw from a lognormal distribution around a median, clamped to
  :data:`LATENCY_CLAMP` times that median (:func:`draw_latency`): a DeleteObjects
  ``DELETE_BASE + DELETE_PER_KEY * keys`` for the keys forwarded (130 ms for 500
  keys, 230 ms for 1,000), a list page ``LIST_BASE``, anything else, throttled answers included,
  ``OTHER_BASE``.  This is a model, not a measurement of AWS: the medians are an
  assumption of the right order of magnitude (AWS's performance whitepaper puts
  small-object latencies at roughly 100-200 ms), and the spread (``LATENCY_SIGMA``)
  is chosen for a plausible tail.  The draws use their own
  ``random.Random(seed + 1)``.

Every DeleteObjects and DeleteObject is recorded as an :class:`Arrival` (other
writes are limited but not recorded; the conditions probe a run's start sends
passes untouched, see :func:`~tests.rig.s3_messages.is_probe_request`); the
queries (:meth:`AwsModel.max_window_keys`, :meth:`AwsModel.accepted_rate`, ...) read
those records.  Everything is safe to use from any thread while requests flow.

The budget's arithmetic and the latency draws are small pure pieces in
:mod:`tests.rig.aws_budget`, the records and their queries in
:mod:`tests.rig.aws_records`.
"""

from __future__ import annotations

import collections
import http.client
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from tests.rig.aws_budget import (
    LIST_BASE,
    OTHER_BASE,
    WRITE_RATE,
    Partition,
    WriteBudget,
    delete_latency_median,
    draw_latency,
    partition_of,
)
from tests.rig.aws_records import Arrival, DeleteRecords
from tests.rig.proxy import ProxyHandler, ReverseProxy
from tests.rig.s3_messages import (
    SLOWDOWN_BODY,
    SLOWDOWN_MESSAGE,
    delete_result,
    fix_integrity_headers,
    is_delete_objects,
    is_probe_request,
    key_errors,
    merge_errors,
    split_delete_body,
)

__all__ = ["FORMS", "RETRY_AFTER_HEADER", "AwsModel"]

#: The ways S3 says SlowDown to a DeleteObjects (see the module docstring).
FORMS = ("503", "200", "per_key")
#: The header newer AWS SDKs read a server's suggested retry delay from, in milliseconds.
RETRY_AFTER_HEADER = "x-amz-retry-after"
#: Methods that spend a write token when they name a key.
_WRITE_METHODS = frozenset({"PUT", "POST", "DELETE"})


@dataclass(frozen=True, slots=True)
class _Verdict:
    """What the model decided for one write request."""

    form: str | None
    granted: dict[Partition, int]
    retry_after_ms: int | None

    @property
    def accepted(self) -> int:
        return sum(self.granted.values())


class AwsModel(ReverseProxy, DeleteRecords):
    """A proxy in front of an S3 endpoint that answers like AWS S3 under write load.

    See the module docstring for the rules and where they come from; the records and
    their queries are :class:`~tests.rig.aws_records.DeleteRecords`'s.
    """

    label = "aws model"

    def __init__(
        self,
        upstream_url: str,
        *,
        port: int = 0,
        write_rate: float = WRITE_RATE,
        burst_seconds: float = 1.0,
        forms: Sequence[str] = FORMS,
        seed: int = 0,
        latency: bool = True,
        retry_after_ms: int | None = None,
        upstream_timeout: float = 60.0,
    ) -> None:
        """Prepare a model for ``upstream_url`` (``http://host:port``); :meth:`start` runs it.

        ``port`` 0 lets the kernel pick a free one when the proxy starts.
        """
        super().__init__(upstream_url, port=port, upstream_timeout=upstream_timeout)
        if not forms or not set(forms) <= set(FORMS):
            raise ValueError(f"forms must be some of {FORMS}, not {forms!r}")
        if retry_after_ms is not None and retry_after_ms < 0:
            raise ValueError(f"retry_after_ms must be >= 0, not {retry_after_ms}")
        self.forms = tuple(forms)
        self.latency = latency
        self.retry_after_ms = retry_after_ms
        DeleteRecords.__init__(self)
        self._budget = WriteBudget(write_rate, write_rate * burst_seconds)
        self._form_random = random.Random(seed)
        self._latency_random = random.Random(seed + 1)
        self._forced: collections.deque[tuple[str, int | None]] = collections.deque()

    def force_throttle(
        self, requests: int, form: str = "503", retry_after_ms: int | None = None
    ) -> None:
        """Throttle the next ``requests`` DeleteObjects in ``form``, whatever the budget holds.

        A forced ``"per_key"`` throttles every key.  ``retry_after_ms`` is sent as
        ``x-amz-retry-after`` (else the model's own ``retry_after_ms``, if any).
        Calls add up: two calls of 2 throttle the next 4.
        """
        if form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, not {form!r}")
        with self._lock:
            self._forced.extend([(form, retry_after_ms)] * requests)

    # -- the rules

    def handle(self, request: ProxyHandler) -> None:
        """Spend the write budget, throttle or forward, after the modelled latency."""
        arrived = time.monotonic()
        body = request.read_body()
        if is_probe_request(request.command, request.path, body):
            # The conditions probe of a run's start (a dozen requests, once per scope)
            # is not the pipeline's load: it passes unmodelled and unrecorded.
            request.relay(body)
            return
        if is_delete_objects(request.command, request.path):
            self._delete_objects(request, body, arrived)
            return
        parts = urlsplit(request.path)
        bucket, _, key = unquote(parts.path)[1:].partition("/")
        if key and request.command in _WRITE_METHODS:
            self._single_write(request, body, arrived, partition_of(bucket, key))
            return
        median = OTHER_BASE
        if request.command == "GET" and parse_qs(parts.query).get("list-type") == ["2"]:
            median = LIST_BASE
            with self._lock:
                self._list_requests += 1
        if self._wait(median):
            request.drop_connection()
            return
        request.relay(body)

    def _single_write(
        self, request: ProxyHandler, body: bytes | None, arrived: float, partition: Partition
    ) -> None:
        """A DeleteObject, PUT or POST to a key: one token, or 503 SlowDown."""
        with self._lock:
            admitted = self._budget.take_all({partition: 1}, arrived)
            if request.command == "DELETE":
                agent = request.headers.get("User-Agent", "")
                form = None if admitted else "503"
                self._arrivals.append(Arrival(arrived, 1, int(admitted), form, agent))
        if self._wait(OTHER_BASE):
            request.drop_connection()
        elif admitted:
            request.relay(body)
        else:
            request.reply(
                http.client.SERVICE_UNAVAILABLE, SLOWDOWN_BODY, self._retry(self.retry_after_ms)
            )

    def _delete_objects(self, request: ProxyHandler, body: bytes | None, arrived: float) -> None:
        """A DeleteObjects: forward it whole, throttle it whole, or forward part of it."""
        parsed = None if body is None else split_delete_body(body, frozenset())
        if parsed is None or body is None:
            # Not S3's XML: it names no key to count, and the upstream answers MalformedXML.
            request.relay(body)
            return
        bucket = unquote(urlsplit(request.path).path)[1:].partition("/")[0]
        needs = collections.Counter(partition_of(bucket, k) for k in parsed.forwarded_keys)
        with self._lock:
            verdict = self._judge(needs, arrived)
            self._arrivals.append(
                Arrival(
                    arrived,
                    len(parsed.forwarded_keys),
                    verdict.accepted,
                    verdict.form,
                    request.headers.get("User-Agent", ""),
                )
            )
        accepted = verdict.accepted
        if self._wait(delete_latency_median(accepted) if accepted else OTHER_BASE):
            request.drop_connection()
            return
        headers = self._retry(verdict.retry_after_ms)
        if verdict.form is None:
            request.relay(body)
        elif verdict.form == "503":
            request.reply(http.client.SERVICE_UNAVAILABLE, SLOWDOWN_BODY, headers)
        elif verdict.form == "200":
            request.reply(http.client.OK, SLOWDOWN_BODY, headers)
        else:
            self._forward_granted(request, body, bucket, verdict.granted, headers)

    def _forward_granted(
        self,
        request: ProxyHandler,
        body: bytes,
        bucket: str,
        granted: Mapping[Partition, int],
        headers: list[tuple[str, str]],
    ) -> None:
        """Forward only the granted keys; the rest come back as per-key SlowDown errors."""
        left = dict(granted)

        def refuse(key: str) -> bool:
            partition = partition_of(bucket, key)
            if left.get(partition, 0) > 0:
                left[partition] -= 1
                return False
            return True

        # Parsed a second time, only here: which keys go is known only after the budget
        # has been asked, and the version ids of the refused ones are needed for the errors.
        split = split_delete_body(body, refuse)
        if split is None:
            raise AssertionError("the body parsed a moment ago")
        errors = key_errors(split.denied, "SlowDown", SLOWDOWN_MESSAGE)
        if not split.forwarded_keys:
            request.reply(http.client.OK, delete_result(errors), headers)
            return
        forward = fix_integrity_headers(request.forward_headers(split.body), split.body)
        response = request.exchange(forward, split.body)
        if response is None:
            return
        if response.status == http.client.OK:
            response = response._replace(
                body=merge_errors(response.body, errors), headers=response.headers + headers
            )
        request.send(*response)

    # -- used by the rules, on the handler threads

    def _judge(self, needs: Mapping[Partition, int], now: float) -> _Verdict:
        """Decide a DeleteObjects; the caller holds the lock."""
        if self._forced:
            form, retry_after_ms = self._forced.popleft()
            return _Verdict(
                form, {}, self.retry_after_ms if retry_after_ms is None else retry_after_ms
            )
        if self._budget.take_all(needs, now):
            return _Verdict(None, dict(needs), None)
        form = self._form_random.choice(self.forms)
        granted = self._budget.take_some(needs, now) if form == "per_key" else {}
        return _Verdict(form, granted, self.retry_after_ms)

    def _wait(self, median: float) -> bool:
        """Sleep one latency draw around ``median``; True if the proxy began stopping."""
        if not self.latency:
            return False
        with self._lock:
            seconds = draw_latency(median, self._latency_random)
        return self.pause(seconds)

    @staticmethod
    def _retry(retry_after_ms: int | None) -> list[tuple[str, str]]:
        return [] if retry_after_ms is None else [(RETRY_AFTER_HEADER, str(retry_after_ms))]
