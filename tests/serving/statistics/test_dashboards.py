"""Every PromQL expression shipped in grafana/ and deploy/prometheus/ uses metrics a real scrape has.

Checked against the live stack of this package's fixtures: the statistics service
after traffic (so drift and variable metrics exist), a real Prometheus scraping it
with the shipped alert rules loaded, and ``promtool`` for the rule file itself.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from serving.statistics.prometheus_config import ALERT_RULES, REPO
from tests.serving.statistics.promql import dashboard_expressions, grafana_query, metric_names, rule_expressions
from tests.serving.statistics.support import Prometheus, Service, run_workers
from tests.support.procs import wait_until

# the LLM dashboard's metrics need a real engine: checked in test_llm_statistics_e2e.py
DASHBOARDS = sorted(p for p in (REPO / "grafana" / "dashboards").glob("*.json") if p.name != "llm.json")
# Prometheus' own series for each target, not exported by any application
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_series_added",
             "scrape_samples_post_metric_relabeling"}


def all_expressions() -> list[tuple[str, str]]:
    found = [item for path in DASHBOARDS for item in dashboard_expressions(path)]
    return found + list(rule_expressions(ALERT_RULES))


@pytest.fixture(scope="module")
def scraped(prom: Prometheus, stats_service: Service) -> set[str]:
    """Sample names of a real scrape once every metric family has data, as seen by Prometheus too."""
    run_workers(stats_service.env, [("dash-e", 1, 200, "reference", 51)])
    run_workers(stats_service.env, [("dash-e", 1, 60, "shifted", 52), ("dash-e", 2, 60, "reference", 53),
                                    ("dash-e", 3, 40, "shadow", 54), ("dash-e", 1, 40, "keys", 55)])
    # load outcomes, as worker processes send them (serving/worker/gate.py): version 4 failed, 2 ready
    outcomes = [{"endpoint": "dash-e", "version": v, "model_state": {"state": state, "model": "clf",
                                                                      "engine": "onnxruntime", "reason": "model"}}
                for v, state in ((4, "failed"), (2, "ready"))]
    httpx.post(stats_service.url + "/events", json=outcomes, headers=stats_service.headers,
               timeout=10).raise_for_status()
    # the prediction log's counts, and a logged prediction given its ground truth (docs/prediction-log.md)
    logged = [{"endpoint": "dash-e", "version": None, "prediction_log": {"written": 3, "dropped": 1}},
              {"endpoint": "dash-e", "version": 1, "status": 200, "request_id": "dash-labelled",
               "prediction": {"label": "POSITIVE"}}]
    httpx.post(stats_service.url + "/events", json=logged, headers=stats_service.headers,
               timeout=10).raise_for_status()
    httpx.post(stats_service.url + "/feedback", json={"endpoint": "dash-e", "request_id": "dash-labelled",
                                                      "label": "POSITIVE"},
               headers=stats_service.headers, timeout=10).raise_for_status()
    prom.wait_for('count(serving_drift_psi{endpoint="dash-e"})', lambda v: v >= 3)
    names = {s.name for f in text_string_to_metric_families(stats_service.metrics()) for s in f.samples}
    # Prometheus has every family once a scrape after the last events is in (its interval is seconds)
    wait_until(lambda: names <= prom.metric_names(), timeout=60,
               what="Prometheus to scrape every metric family", on_timeout=lambda: str(names - prom.metric_names()))
    in_prometheus = prom.metric_names()
    return names | (SYNTHETIC & in_prometheus)


def test_dashboards_and_rules_are_found() -> None:
    assert {p.name for p in DASHBOARDS} >= {"overview.json", "drift.json"}
    exprs = all_expressions()
    assert len(exprs) >= 25, exprs
    for where, expr in exprs:
        assert metric_names(expr), f"{where}: no metric in {expr!r}"


@pytest.mark.parametrize("where,expr", all_expressions(), ids=lambda v: v if isinstance(v, str) and ":" in v else "")
def test_expression_uses_only_scraped_metrics(where: str, expr: str, scraped: set[str], prom: Prometheus) -> None:
    missing = metric_names(expr) - scraped
    assert not missing, f"{where}: {sorted(missing)} not in the scrape"
    prom.query(grafana_query(expr, {"scalar": "tokens", "enum": "label"}))  # raises unless valid PromQL


def test_alert_rules_pass_promtool_and_evaluate_in_prometheus(prom: Prometheus, scraped: set[str]) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian package prometheus) is required"
    check = subprocess.run([promtool, "check", "rules", str(ALERT_RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr

    def evaluated() -> list[dict]:
        groups = httpx.get(prom.url + "/api/v1/rules", timeout=10).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r.get("lastEvaluation", "").startswith("20") for r in rules) else []

    rules = wait_until(evaluated, what="every rule evaluated")
    assert {r["name"] for r in rules} == {where.split(": ")[1] for where, _ in rule_expressions(ALERT_RULES)}
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    # the drift alert is pending (its "for" has not elapsed) for the drifted dash-e variables
    drift = next(r for r in rules if r["name"] == "ServingDataDrift")
    pending = {(a["labels"]["endpoint"], a["labels"]["variable"]) for a in drift["alerts"]}
    assert ("dash-e", "tokens") in pending


def test_metric_name_lexer() -> None:
    expr = ('histogram_quantile(0.95, sum by (endpoint, le) (rate(a_bucket{le="0.5", x=~"$e"}[5m] offset 1m)))'
            ' / ignoring (version) group_left sum(b_total) > 1e-3 and on(endpoint) c == bool 2')
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}
    assert metric_names('{__name__="d", job="x"}') == {"d"}
    assert metric_names("max(serving_drift_psi_threshold)") == {"serving_drift_psi_threshold"}
    assert grafana_query('rate(x{e=~"$endpoint", v="${scalar}"}[$__rate_interval])', {"scalar": "t"}) == \
        'rate(x{e=~".*", v="t"}[1m])'


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_is_self_consistent(path: Path) -> None:
    """What Grafana would reject or render empty: duplicate ids, unknown variables, foreign data sources."""
    doc = json.loads(path.read_text())
    panels = doc["panels"]
    assert doc["uid"] and doc["title"].startswith("Serving / ")
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), ids
    defined = {v["name"] for v in doc["templating"]["list"]}
    for panel in panels:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        text = json.dumps(panel)
        used = {a or b for a, b in re.findall(r"\$\{(\w+)[^}]*\}|\$(\w+)", text) if not (a or b).startswith("__")}
        assert used <= defined, f"{panel['title']}: undefined variables {used - defined}"
    provisioning = yaml.safe_load((REPO / "grafana/provisioning/datasources/prometheus.yml").read_text())
    assert {d["uid"] for d in provisioning["datasources"]} >= {v["current"]["value"] for v in doc["templating"]["list"]
                                                             if v["type"] == "datasource"}
