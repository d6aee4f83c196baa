"""deploy/grafana/digest-cleanup.json: every query names a series the endpoint really exports.

A renamed metric would leave a dashboard panel silently empty, so the names are not
checked against a list kept here but against a real scrape: ``RunStateCollector`` over
a real Redis, with a run in progress on a target whose delete budget is AWS's default
(so the ``digest_cleanup_delete_*`` series exist), read back through the exposition
format as Prometheus reads it.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from digest_cleanup.model.batches import BatchRecord
from digest_cleanup.ops.metrics import RunStateCollector
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import Settings
from tests.rig.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "digest-cleanup.json"
#: No endpoint URL and no delete_rate: the target gets the AWS default budget.
TARGETS = """
[targets.statements]
bucket = "digests"
prefix = "statements/"
retention_days = 30
schedule = "0 3 * * 0"
"""
RUN = "statements-20261023T030000Z"

#: Words of PromQL that are neither functions (always followed by "(") nor metrics.
PROMQL_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
     "unless", "offset", "inf", "nan"}
)  # fmt: skip
_TOKEN = re.compile(
    r"""
    "(?:[^"\\]|\\.)*" | '(?:[^'\\]|\\.)*' | `[^`]*`   # string literals
    | \$\{[^}]*\} | \$\w+                          # Grafana variables
    | \{[^}]*\}                                    # label matchers
    | \[[^\]]*\]                                   # range and subquery selectors
    | \b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)  # label lists
    | \d+(?:\.\d+)?(?:e[+-]?\d+)?[a-z]*           # numbers and durations
    | (?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<call>\s*\()?(?P<agg>(?=\s+(?:by|without)\b))?
    """,
    re.VERBOSE | re.IGNORECASE,
)
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<query>.+),)?\s*\w+\s*\)\s*$")


def metric_names(expr: str) -> set[str]:
    """Every metric an expression selects: the identifiers that are neither a function
    call or aggregation, a keyword, a label (inside ``{}`` or ``by (...)``) nor a Grafana variable.

    Grafana's ``label_values(query, label)`` is unwrapped first; it is not PromQL.
    """
    match = _LABEL_VALUES.match(expr)
    if match:
        expr = match.group("query") or ""
    names = set()
    for token in _TOKEN.finditer(expr):
        name = token.group("name")
        called = token.group("call") or token.group("agg") is not None  # f(...), sum by
        if name and not called and name.lower() not in PROMQL_KEYWORDS:
            names.add(name)
    return names


def test_extractor_finds_metrics_and_nothing_else() -> None:
    expr = (
        'histogram_quantile(0.95, max without (a) (rate(digest_cleanup_x_bucket{target=~"$t",'
        'le!="+Inf"}[5m]))) > on (target) group_left digest_cleanup_y offset 1h or vector(7200)'
        " / time() - sum by (target) (digest_cleanup_z[5m:1m]) * 1e3 and bool up"
    )

    assert metric_names(expr) == {
        "digest_cleanup_x_bucket",
        "digest_cleanup_y",
        "digest_cleanup_z",
        "up",
    }
    assert metric_names("label_values(digest_cleanup_run_status, target)") == {
        "digest_cleanup_run_status"
    }
    assert metric_names("label_values(target)") == set()


def test_check_fails_on_a_made_up_metric(exported: frozenset[str]) -> None:
    """Given a query naming a series nobody exports, the check rejects it (the test bites)."""
    with pytest.raises(AssertionError, match="digest_cleanup_not_a_metric_total"):
        check_expr("rate(digest_cleanup_not_a_metric_total[1m])", exported, where="made up")
    with pytest.raises(AssertionError, match="node_load1"):
        check_expr("node_load1 * digest_cleanup_redis_up", exported, where="made up")
    # A histogram counts only through its series: the bare name selects nothing.
    with pytest.raises(AssertionError, match="digest_cleanup_enqueue_to_ack_seconds"):
        check_expr("digest_cleanup_enqueue_to_ack_seconds", exported, where="made up")


def check_expr(expr: str, exported: frozenset[str], where: str) -> None:
    used = metric_names(expr)
    assert used, f"{where}: no metric in {expr!r}"
    foreign = {name for name in used if not name.startswith("digest_cleanup_")}
    assert not foreign, f"{where}: {sorted(foreign)} are not digest-cleanup series: {expr!r}"
    unknown = used - exported
    assert not unknown, f"{where}: the endpoint exports no {sorted(unknown)}: {expr!r}"


@pytest.fixture
def exported(redis_url: str, tmp_path: Path) -> frozenset[str]:
    """The series names one real scrape exports while a run is in progress."""
    path = tmp_path / "targets.toml"
    path.write_text(TARGETS)
    runtime = Runtime(Settings(broker_url=redis_url, targets_file=path, s3_endpoint_url=None))
    fields = {"target": "statements", "cutoff": "2026-10-23T03:00:00+00:00", "batch_size": 500}
    assert runtime.store.runs.open(RUN, fields | {"max_delete": 250_000}) == "created"
    lease = runtime.store.sweeps.take_lease(RUN, 60)
    checkpoint = {"listed": 1000, "expired": 1000, "seq": 2, "done": True}
    batches = [f"{RUN}-b00001", f"{RUN}-b00002"]
    published = dict.fromkeys(batches, b"")
    assert runtime.store.sweeps.save_checkpoint(
        RUN, checkpoint, published, lease=lease, lease_seconds=60
    )
    retried = {"retries": 1, "codes": {"SlowDown": 10}, "retried_codes": ["SlowDown"]}
    record = BatchRecord(batch_id=batches[0], claim=f"{batches[0]}/g0/a0", deleted=490,
                         terminal=False, latency=0.5, **retried)  # fmt: skip
    assert runtime.store.runs.record(RUN, "statements", record) == "recorded"

    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunStateCollector(runtime))
    text = generate_latest(registry).decode()
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(sample.name for sample in family.samples)
        # A family declared without samples yet (no completed run, no verify) still
        # counts: its series appear once there is something to report.
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}_{suffix}" for suffix in ("bucket", "sum", "count"))
        else:
            names.add(family.name)
    # The run really is in progress and the budget really is on.
    assert "digest_cleanup_delete_budget_keys_per_second" in {
        s.name for f in text_string_to_metric_families(text) for s in f.samples
    }
    assert 'digest_cleanup_run_status{status="running",target="statements"} 1.0' in text
    return frozenset(names)


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those inside collapsed rows."""
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, expr) for every panel target and every query variable."""
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            yield (
                f"variable {variable['name']}",
                query if isinstance(query, str) else query["query"],
            )


def test_dashboard_is_an_importable_grafana_model(dashboard: dict[str, Any]) -> None:
    assert dashboard["title"]
    assert dashboard["uid"]
    assert 36 <= dashboard["schemaVersion"] <= 41
    # No hard-wired datasource: a datasource variable lets it import into any Grafana.
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    ids = [p["id"] for p in _panels(dashboard["panels"])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_every_panel_has_a_title_and_the_datasource_variable(dashboard: dict[str, Any]) -> None:
    for panel in _panels(dashboard["panels"]):
        assert panel.get("title"), panel.get("id")
        if panel["type"] == "row":
            continue
        where = panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, where
        assert panel["targets"], f"{where}: no query"
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"]) == panel["datasource"], where
            assert target["expr"].strip(), where
        gridpos = panel["gridPos"]
        assert gridpos["x"] + gridpos["w"] <= 24, where


def test_every_query_names_a_series_the_endpoint_exports(
    dashboard: dict[str, Any], exported: frozenset[str]
) -> None:
    queries = list(_queries(dashboard))

    assert len(queries) > 10
    for where, expr in queries:
        check_expr(expr, exported, where)


def test_dashboard_covers_what_the_issue_asks(dashboard: dict[str, Any]) -> None:
    """The SLO line, the budget, dead letters and run outcomes are each on the board."""
    used = set().union(*(metric_names(expr) for _, expr in _queries(dashboard)))
    assert {
        "digest_cleanup_oldest_pending_age_seconds",
        "digest_cleanup_delete_budget_keys_per_second",
        "digest_cleanup_delete_rate_keys_per_second",
        "digest_cleanup_delete_budget_reserved_keys_total",
        "digest_cleanup_delete_throttles_total",
        "digest_cleanup_dead_letter_depth",
        "digest_cleanup_dead_letter_keys",
        "digest_cleanup_dead_letter_oldest_age_seconds",
        "digest_cleanup_run_status",
        "digest_cleanup_run_progress_ratio",
        "digest_cleanup_last_success_timestamp_seconds",
    } <= used
    slo = next(
        p for p in _panels(dashboard["panels"]) if p["title"].startswith("Oldest pending age")
    )
    steps = slo["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert {"color": "red", "value": 7200} in steps, "the 2 h SLO as a threshold"
    assert slo["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "line"


def test_every_query_is_valid_promql(dashboard: dict[str, Any], tmp_path: Path) -> None:
    """promtool parses each panel query, with Grafana's variables put as Grafana would."""
    promtool = require_tool("promtool")
    exprs = [
        re.sub(r"\$\{?target\}?", ".*", expr)
        for where, expr in _queries(dashboard)
        if where.startswith("panel ")
    ]
    rules = [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))

    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )

    assert result.returncode == 0, result.stdout + result.stderr
