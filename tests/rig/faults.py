"""A fault-injecting proxy to put in front of an S3 endpoint in tests.

Neither ``weed mini`` nor moto can throttle, drop connections or refuse single
keys on demand, so :class:`FaultProxy` sits between the code under test and the
real server and does it.  It is a rule set on
:class:`~tests.rig.proxy.ReverseProxy`: a request no fault applies to
is forwarded as it came, and its response comes back as it came::

    with FaultProxy(weed.endpoint_url) as proxy:
        proxy.slowdown_rate = 0.3          # 30 % of DeleteObjects get 503 SlowDown
        proxy.deny_keys = {"a/locked.pdf"}  # per-key AccessDenied, the rest deleted
        run_cleanup(endpoint_url=proxy.endpoint_url)
        assert not proxy.duplicate_deletes()

Every fault switch and counter is safe to use from any thread while requests flow.
It is long because every fault rule lives here, beside the switch that turns it on,
so one module answers "what can the proxy do to a request?".
"""

from __future__ import annotations

import collections
import http.client
import math
import random
import threading
import time
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit

from tests.rig import s3_listings
from tests.rig.proxy import ProxyHandler, ReverseProxy
from tests.rig.s3_messages import (
    ACCESS_DENIED_BODY,
    SLOWDOWN_BODY,
    access_denied_entries,
    delete_result,
    error_body,
    fix_integrity_headers,
    is_delete_objects,
    is_probe_request,
    key_errors,
    merge_errors,
    split_delete_body,
)

__all__ = ["FaultProxy"]

#: The headers of a conditional DeleteObject, dropped under ``strip_conditions``.
_CONDITION_HEADERS = frozenset({"if-match", "if-none-match"})
#: S3's message for a delete whose ETag condition it did not accept.
_PRECONDITION_MESSAGE = "At least one of the pre-conditions you specified did not hold"


class FaultProxy(ReverseProxy):
    """A reverse proxy in front of an S3 endpoint that injects faults on demand.

    Faults, switchable at any time from any thread:

    * ``slowdown_rate`` - the share of DeleteObjects requests answered ``503
      SlowDown`` with ``Retry-After`` (``retry_after`` seconds) and not forwarded.
      The draw uses a ``random.Random(seed)``, so a run is reproducible.
    * ``down`` / :meth:`down_for` - every request has its connection closed without
      an answer, as when S3 is unreachable.
    * ``delay`` - seconds to wait before handling each request (a slow S3).
    * ``deny_keys`` - keys that DeleteObjects must not delete: they come back as
      per-key ``AccessDenied`` errors, while the other keys are deleted upstream.
    * ``deny_puts_under`` - a path (``/bucket/prefix``) under which every PUT is
      answered ``403 AccessDenied`` and not forwarded, as for a role that may not
      write there.
    * ``strip_conditions`` - delete conditions (DeleteObjects' per-object ``<ETag>``,
      DeleteObject's ``If-Match``) are dropped before forwarding, as by a server
      that ignores them without saying so.
    * ``listing_rewrites`` - ListObjectsV2 answers are written back another valid
      way: control characters as numeric references, keys as from a server that
      ignores ``encoding-type=url``, the continuation token between the objects
      (see :mod:`~tests.rig.s3_listings`); counted per page as
      ``listing_rewritten``.
    * ``precondition_failed_keys`` - keys whose conditional delete is refused with
      ``PreconditionFailed`` (per key in a DeleteObjects answer, 412 for a
      DeleteObject) without being forwarded, whatever their ETag: a server that
      compares ETags in another form than it lists them.
    * ``not_found_keys`` - keys whose HEAD, GET and DeleteObject are answered with a
      bare 404 (no S3 error code) without being forwarded, as by a gateway or a
      wrong endpoint path that does not route them to S3.
    * ``forbidden_keys`` - keys whose HEAD and GET are answered 403, as AWS answers a
      caller without s3:ListBucket on the whole bucket for a key that is missing.

    The conditions probe a run makes at its start (keys under ``PROBE_PREFIX`` of
    :mod:`digest_cleanup.kinds.s3_probe`) is spared every fault but
    ``strip_conditions``, which is what it probes for, and its requests are
    counted in ``probe_requests`` only: the faults are aimed at the pipeline, and
    a probe failed by one would refuse the run before the pipeline is reached.
    Set ``fault_probe = True`` to aim them at the probe too.

    Counters: ``requests_total``, ``probe_requests`` (requests on probe keys),
    ``delete_requests`` (DeleteObjects forwarded upstream), ``deleted_key_counts`` (how
    often each key was in a forwarded DeleteObjects) and ``faults_injected`` by kind
    (``slowdown``, ``down``, ``delay``, ``put_denied``, ``bare_404``, and
    ``access_denied`` and ``precondition_failed`` counted per key).
    """

    label = "fault proxy"

    def __init__(
        self,
        upstream_url: str,
        *,
        port: int = 0,
        seed: int = 0,
        retry_after: int = 1,
        upstream_timeout: float = 60.0,
    ) -> None:
        """Prepare a proxy for ``upstream_url`` (``http://host:port``); :meth:`start` runs it.

        ``port`` 0 lets the kernel pick a free one when the proxy starts.
        """
        super().__init__(upstream_url, port=port, upstream_timeout=upstream_timeout)
        self.retry_after = retry_after
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._slowdown_rate = 0.0
        self._delay = 0.0
        self._down_until = 0.0
        self._deny_keys: frozenset[str] = frozenset()
        #: See the class docstring; assign any collection of keys, read a frozenset.
        self.precondition_failed_keys: frozenset[str] = frozenset()
        self.not_found_keys: frozenset[str] = frozenset()
        #: Keys whose HEAD and GET answer 403 (see the class docstring).
        self.forbidden_keys: frozenset[str] = frozenset()
        #: Drop delete conditions before forwarding (see the class docstring).
        self.strip_conditions = False
        #: How to rewrite ListObjectsV2 answers (see the class docstring); none when empty.
        self.listing_rewrites: frozenset[str] = frozenset()
        #: Let the other faults hit the conditions probe too (see the class docstring).
        self.fault_probe = False
        self._probe_requests = 0
        #: Refuse every PUT under this path (see the class docstring); "" refuses none.
        self.deny_puts_under = ""
        self._requests_total = 0
        self._delete_requests = 0
        self._deleted_key_counts: collections.Counter[str] = collections.Counter()
        self._faults: collections.Counter[str] = collections.Counter()

    # -- fault switches

    @property
    def slowdown_rate(self) -> float:
        """The share (0.0-1.0) of DeleteObjects requests answered 503 SlowDown."""
        return self._slowdown_rate

    @slowdown_rate.setter
    def slowdown_rate(self, rate: float) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"slowdown_rate must be within 0.0-1.0, not {rate}")
        self._slowdown_rate = float(rate)

    @property
    def delay(self) -> float:
        """Seconds each request waits before it is handled."""
        return self._delay

    @delay.setter
    def delay(self, seconds: float) -> None:
        if seconds < 0 or math.isnan(seconds):
            raise ValueError(f"delay must be >= 0, not {seconds}")
        self._delay = float(seconds)

    @property
    def down(self) -> bool:
        """Whether the proxy drops every connection without answering."""
        return time.monotonic() < self._down_until

    @down.setter
    def down(self, value: bool) -> None:
        self._down_until = math.inf if value else 0.0

    def down_for(self, seconds: float) -> None:
        """Be down from now for ``seconds``, then recover by itself."""
        self._down_until = time.monotonic() + seconds

    @property
    def deny_keys(self) -> frozenset[str]:
        """Keys whose deletion DeleteObjects refuses with a per-key AccessDenied.

        Assign a new collection to change it (``proxy.deny_keys = {"k"}``); the
        value read back is a snapshot, so it cannot be changed in place by mistake.
        """
        return self._deny_keys

    @deny_keys.setter
    def deny_keys(self, keys: Iterable[str]) -> None:
        self._deny_keys = frozenset(keys)

    def clear_faults(self) -> None:
        """Turn every fault off; counters are kept."""
        self.slowdown_rate = 0.0
        self.delay = 0.0
        self.down = False
        self.deny_keys = frozenset()
        self.precondition_failed_keys = frozenset()
        self.not_found_keys = frozenset()
        self.forbidden_keys = frozenset()
        self.strip_conditions = False
        self.deny_puts_under = ""
        self.listing_rewrites = frozenset()

    # -- counters

    @property
    def requests_total(self) -> int:
        """Requests received, whatever happened to them."""
        with self._lock:
            return self._requests_total

    @property
    def probe_requests(self) -> int:
        """Requests on the conditions probe's keys, which no other counter counts."""
        with self._lock:
            return self._probe_requests

    @property
    def delete_requests(self) -> int:
        """DeleteObjects requests forwarded upstream."""
        with self._lock:
            return self._delete_requests

    @property
    def deleted_key_counts(self) -> collections.Counter[str]:
        """A copy of: key -> how many forwarded DeleteObjects requests named it."""
        with self._lock:
            return collections.Counter(self._deleted_key_counts)

    @property
    def faults_injected(self) -> collections.Counter[str]:
        """A copy of: fault kind -> how many times it was applied."""
        with self._lock:
            return collections.Counter(self._faults)

    def duplicate_deletes(self) -> dict[str, int]:
        """Keys sent upstream for deletion more than once, with their counts."""
        with self._lock:
            return {key: n for key, n in self._deleted_key_counts.items() if n > 1}

    def reset_counters(self) -> None:
        """Zero every counter (faults stay as they are)."""
        with self._lock:
            self._requests_total = 0
            self._probe_requests = 0
            self._delete_requests = 0
            self._deleted_key_counts.clear()
            self._faults.clear()

    # -- the rules

    def handle(self, request: ProxyHandler) -> None:
        """Apply the active faults to one request, forwarding it unless a fault answers."""
        self._count_request()
        # Read first: a DeleteObjects names its keys in the body, probe keys too.
        body = request.read_body()
        if not self.fault_probe and is_probe_request(request.command, request.path, body):
            self._relay_probe(request, body)
            return
        if self.down:
            self._count_fault("down")
            request.drop_connection()
            return
        delay = self.delay
        if delay > 0:
            self._count_fault("delay")
            if self.pause(delay):
                request.drop_connection()
                return
        deny_puts = self.deny_puts_under
        if (
            deny_puts
            and request.command == "PUT"
            and urlsplit(request.path).path.startswith(deny_puts)
        ):
            self._count_fault("put_denied")
            request.reply(http.client.FORBIDDEN, ACCESS_DENIED_BODY, [])
            return
        if self._answer_for_key(request):
            return
        if is_delete_objects(request.command, request.path):
            self._delete_objects(request, body)
            return
        rewrites = self.listing_rewrites
        if rewrites and s3_listings.is_list_objects_v2(request.command, request.path):
            self._rewrite_listing(request, body, rewrites)
            return
        # A DeleteObject carries its condition in headers; DeleteObjects in its body.
        stripped = self.strip_conditions and request.command == "DELETE"
        request.relay(body, drop=_CONDITION_HEADERS if stripped else frozenset())

    def _rewrite_listing(
        self, request: ProxyHandler, body: bytes | None, rewrites: frozenset[str]
    ) -> None:
        """Forward a ListObjectsV2 and answer with its page rewritten (``listing_rewrites``)."""
        response = request.exchange(request.forward_headers(body), body)
        if response is None:
            return
        page = s3_listings.rewrite(response.body, rewrites) if response.status == 200 else None
        if page is not None:
            self._count_fault("listing_rewritten")
            response = response._replace(body=page)
        request.send(*response)

    def _delete_objects(self, request: ProxyHandler, body: bytes | None) -> None:
        """Apply SlowDown and per-key denial to a DeleteObjects request."""
        if self._roll_slowdown():
            self._count_fault("slowdown")
            request.reply(
                http.client.SERVICE_UNAVAILABLE,
                SLOWDOWN_BODY,
                [("Retry-After", str(self.retry_after))],
            )
            return
        deny, mismatch = self.deny_keys, self.precondition_failed_keys
        parsed = (
            None
            if body is None
            else split_delete_body(body, deny | mismatch, strip_conditions=self.strip_conditions)
        )
        if parsed is None:
            request.relay(body)
            return
        denied = [d for d in parsed.denied if d[0] in deny]
        refused = [d for d in parsed.denied if d[0] not in deny]
        if denied:
            self._count_fault("access_denied", len(denied))
        if refused:
            self._count_fault("precondition_failed", len(refused))
        injected = access_denied_entries(denied) + key_errors(
            refused, "PreconditionFailed", _PRECONDITION_MESSAGE
        )
        if parsed.denied and not parsed.forwarded_keys:
            # Nothing left to delete: answer as S3 would, without a round trip.
            request.reply(http.client.OK, delete_result(injected), [])
            return
        self._count_delete(parsed.forwarded_keys)
        headers = request.forward_headers(parsed.body)
        if parsed.body is not body:
            headers = fix_integrity_headers(headers, parsed.body)
        response = request.exchange(headers, parsed.body)
        if response is None:
            return
        if injected and response.status == http.client.OK:
            response = response._replace(body=merge_errors(response.body, injected))
        request.send(*response)

    def _answer_for_key(self, request: ProxyHandler) -> bool:
        """Answer a request on one key under ``not_found_keys`` or ``precondition_failed_keys``.

        True when the proxy answered it itself (and did not forward it).
        """
        if request.command not in ("HEAD", "GET", "DELETE"):
            return False
        _, _, key = unquote(urlsplit(request.path).path).lstrip("/").partition("/")
        if not key:
            return False  # a bucket-level request (a listing), never one key's
        if key in self.forbidden_keys and request.command in ("HEAD", "GET"):
            self._count_fault("forbidden")
            body = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
            xml = [("Content-Type", "application/xml")]
            request.send(http.client.FORBIDDEN, "Forbidden", xml, body)
            return True
        if key in self.not_found_keys:
            self._count_fault("bare_404")
            request.send(http.client.NOT_FOUND, "Not Found", [("Content-Type", "text/plain")],
                         b"404 page not found\n")  # fmt: skip
            return True
        conditional = any(h.lower() in _CONDITION_HEADERS for h in request.headers)
        if request.command == "DELETE" and conditional and key in self.precondition_failed_keys:
            self._count_fault("precondition_failed")
            body = error_body("PreconditionFailed", _PRECONDITION_MESSAGE)
            request.reply(http.client.PRECONDITION_FAILED, body, [])
            return True
        return False

    def _relay_probe(self, request: ProxyHandler, body: bytes | None) -> None:
        """Forward a conditions probe's request, less its conditions under ``strip_conditions``."""
        with self._lock:
            self._probe_requests += 1
        if not self.strip_conditions or request.command not in ("POST", "DELETE"):
            request.relay(body)
            return
        if request.command == "DELETE":
            request.relay(body, drop=_CONDITION_HEADERS)
            return
        parsed = None if body is None else split_delete_body(body, frozenset(),
                                                             strip_conditions=True)  # fmt: skip
        if parsed is None or parsed.body is body:
            request.relay(body)
            return
        headers = fix_integrity_headers(request.forward_headers(parsed.body), parsed.body)
        response = request.exchange(headers, parsed.body)
        if response is not None:
            request.send(*response)

    # -- used by the rules, on the handler threads

    def _count_request(self) -> None:
        with self._lock:
            self._requests_total += 1

    def _count_fault(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self._faults[kind] += n

    def _count_delete(self, keys: Iterable[str]) -> None:
        with self._lock:
            self._delete_requests += 1
            self._deleted_key_counts.update(keys)

    def _roll_slowdown(self) -> bool:
        # One lock around the draw keeps the seeded sequence the same in every run
        # (as long as requests arrive in the same order).
        with self._lock:
            rate = self._slowdown_rate
            return rate > 0 and self._random.random() < rate


#: The names these two had when they lived here, for code that imports them from here.
_fix_integrity_headers = fix_integrity_headers
_merge_errors = merge_errors
