"""The Grafana dashboard and its provisioning, checked as data: Grafana itself cannot be installed here.

What Grafana would check when compose's ``monitoring`` profile starts it: the dashboard provider's
folder is where compose mounts deploy/grafana/dashboards, the dashboard JSON sits there, the data
source is the compose network's Prometheus, and every panel has a data source and a query. That each
query returns series from a real fastslow is tests/test_prometheus_dashboard.py's part.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from fastslow.api.app._metrics import ApiMetrics

REPO = Path(__file__).resolve().parent.parent
GRAFANA = REPO / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "fastslow.json"
PROVIDER = GRAFANA / "provisioning" / "dashboards" / "fastslow.yml"
DATASOURCE = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
COMPOSE = REPO / "docker-compose.yml"


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


@pytest.fixture(scope="module")
def grafana() -> dict[str, Any]:
    service: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]["grafana"]
    return service


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's panels with queries (rows are only headings), nested rows' included."""
    found = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> host source of a service's bind mounts."""
    result = {}
    for volume in service["volumes"]:
        source, target = volume.removesuffix(":ro").split(":")
        result[target] = source
    return result


def test_the_provider_reads_the_folder_compose_mounts_with_the_dashboard_in_it(grafana: dict[str, Any]) -> None:
    # The provisioning layout: providers under provisioning/dashboards, the dashboard JSON beside it.
    assert PROVIDER.parent.parent == DATASOURCE.parent.parent == GRAFANA / "provisioning"
    (provider,) = yaml.safe_load(PROVIDER.read_text())["providers"]
    assert provider["type"] == "file"
    mounted = mounts(grafana)
    assert mounted["/etc/grafana/provisioning"] == "./deploy/grafana/provisioning"
    folder = mounted[provider["options"]["path"]]
    assert (REPO / folder).resolve() == DASHBOARD.parent
    assert sorted(p.name for p in DASHBOARD.parent.iterdir()) == [DASHBOARD.name]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(home).parent.as_posix() == provider["options"]["path"] and Path(home).name == DASHBOARD.name
    # Provisioned read-only: an edit in the UI would be lost at the next start.
    assert provider["disableDeletion"] and not provider["allowUiUpdates"]


def test_the_data_source_is_the_compose_networks_prometheus() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())["services"]
    (source,) = yaml.safe_load(DATASOURCE.read_text())["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"]
    assert source["url"] == "http://prometheus:9090" and "prometheus" in compose
    assert "--config.file=/etc/prometheus/prometheus.yml" in compose["prometheus"]["command"]
    # $__rate_interval is four scrape intervals: Grafana must know Prometheus' one.
    scrape = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())["global"]["scrape_interval"]
    assert source["jsonData"]["timeInterval"] == scrape


def test_every_panel_has_a_prometheus_data_source_and_a_query(dashboard: dict[str, Any]) -> None:
    (source,) = yaml.safe_load(DATASOURCE.read_text())["datasources"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    chooser = variables["datasource"]
    assert chooser["type"] == "datasource" and chooser["query"] == "prometheus"
    assert chooser["current"]["value"] == source["uid"]

    def is_prometheus(ref: Any) -> bool:
        return isinstance(ref, dict) and ref.get("type") == "prometheus" and ref.get("uid") == "${datasource}"

    assert panels(dashboard)
    for panel in panels(dashboard):
        where = f"panel {panel.get('title')!r}"
        assert is_prometheus(panel.get("datasource")), where
        assert panel["targets"], where
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"]), where
        for target in panel["targets"]:
            assert target["expr"].strip(), where
            assert is_prometheus(target.get("datasource", panel["datasource"])), where
        assert panel["title"] and panel.get("description"), where
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), where
    assert is_prometheus(variables["task"]["datasource"])


def test_panels_are_unique_and_stay_on_the_grid(dashboard: dict[str, Any]) -> None:
    every = dashboard["panels"]
    assert len({p["id"] for p in every}) == len(every)
    assert len({p["title"] for p in every}) == len(every)
    assert dashboard["uid"] == "fastslow" and isinstance(dashboard["schemaVersion"], int)
    cells: set[tuple[int, int]] = set()
    for panel in every:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        here = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not here & cells, f"panel {panel['title']!r} overlaps another"
        cells |= here


def test_the_queries_name_only_series_the_api_exports_and_cover_the_issue(dashboard: dict[str, Any]) -> None:
    exported = set()
    for family in ApiMetrics().registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        exported |= {family.name + suffix for suffix in suffixes}
    named = {
        name
        for panel in panels(dashboard)
        for target in panel["targets"]
        for name in re.findall(r"\bfastslow_[a-z0-9_]+", target["expr"])
    }
    assert named <= exported, named - exported
    # Decisions rate, kept share, escalations by reason, System-2 cost, saving, latency per engine and
    # per task, drift, breakers.
    assert {
        "fastslow_decisions_total",
        "fastslow_log_kept_share",
        "fastslow_escalations_by_reason_total",
        "fastslow_system2_cost_usd_total",
        "fastslow_log_system2_cost_usd",
        "fastslow_log_saved_usd",
        "fastslow_engine_latency_seconds_bucket",
        "fastslow_decision_latency_seconds_bucket",
        "fastslow_drift",
        "fastslow_engine_breaker_state",
    } <= named
    exprs = [t["expr"] for p in panels(dashboard) for t in p["targets"]]
    for quantile in ("0.5", "0.99"):
        assert any(f"histogram_quantile({quantile}" in e and "engine_latency" in e for e in exprs)
        assert any(f"histogram_quantile({quantile}" in e and "decision_latency" in e for e in exprs)
    # The shared log's gauges are alike on every replica: never summed across them.
    for expr in exprs:
        if re.search(r"fastslow_(log_|drift)", expr):
            assert expr.startswith("max by") and "sum" not in expr, expr


def test_grafana_is_optional_pinned_on_loopback_and_needs_an_admin_password(grafana: dict[str, Any]) -> None:
    assert grafana["profiles"] == ["monitoring"]
    assert grafana["image"].startswith("${GRAFANA_IMAGE:-grafana/grafana:11.")
    assert not grafana["image"].endswith(":latest}")
    (port,) = grafana["ports"]
    assert port.startswith("127.0.0.1:${GRAFANA_PORT:-3000}:")
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    # Anonymous visitors may only view.
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
