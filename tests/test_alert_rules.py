"""The Prometheus alert rules (deploy/alerts.yml): valid, loaded by deploy/prometheus.yml, and each one
shown firing under its condition and silent without it by promtool's unit tests
(tests/prometheus/alerts_test.yml). The live conditions (a dead engine's breaker, a broken policy file,
drift) are induced against a real server in tests/test_prometheus_dashboard.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from fastslow.api.app._metrics import ApiMetrics

from fakes.prometheus import binary

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "deploy" / "alerts.yml"
RULE_TESTS = REPO / "tests" / "prometheus" / "alerts_test.yml"
PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus.yml"
ALERTS = {"FastslowBreakerOpen", "FastslowPolicyReloadFailed", "FastslowKeptShareFalling", "FastslowDrift"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=REPO, check=False
    )


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def exported_series() -> set[str]:
    """Every series name the API can export (counters with ``_total``, histograms with their parts)."""
    names = set()
    for family in ApiMetrics().registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names |= {f"{family.name}_{part}" for part in ("bucket", "sum", "count")}
        else:
            names.add(family.name)
    return names


def test_promtool_accepts_the_rules_and_the_configuration_that_loads_them() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in checked.stdout
    config = promtool("check", "config", str(PROMETHEUS_CONFIG))
    assert config.returncode == 0, config.stdout + config.stderr
    assert "SUCCESS: 1 rule files found" in config.stdout


def test_each_alert_fires_under_its_condition_and_is_silent_without_it() -> None:
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    # Every alert has a case where it fires and one where it must not (an empty exp_alerts).
    cases = [case for test in yaml.safe_load(RULE_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    firing = {case["alertname"] for case in cases if case.get("exp_alerts")}
    silent = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    assert firing == silent == ALERTS == {rule["alert"] for rule in rules()}


def test_promtool_notices_an_alert_that_does_not_fire(tmp_path: Path) -> None:
    """The unit tests can fail: with the drift alert's condition inverted, its case fails."""
    broken_rules = tmp_path / "alerts.yml"
    broken_rules.write_text(
        RULES.read_text().replace("max by (task) (fastslow_drift) == 1", "max by (task) (fastslow_drift) == 2")
    )
    broken_tests = tmp_path / "alerts_test.yml"
    broken_tests.write_text(RULE_TESTS.read_text().replace("../../deploy/alerts.yml", str(broken_rules)))
    result = promtool("test", "rules", str(broken_tests))
    assert result.returncode != 0
    assert "FastslowDrift" in result.stdout + result.stderr


def test_the_rules_name_only_series_the_api_exports_and_say_what_to_do() -> None:
    exported = exported_series()
    for rule in rules():
        named = set(re.findall(r"\bfastslow_[a-z0-9_]+", rule["expr"]))
        assert named and named <= exported, (rule["alert"], named - exported)
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    # No rule groups by a tenant: the series carry none.
    assert "tenant" not in RULES.read_text()


def test_alerts_on_shared_log_figures_take_the_max_across_replicas() -> None:
    shared = [rule for rule in rules() if re.search(r"fastslow_(log_|drift)", rule["expr"])]
    assert {rule["alert"] for rule in shared} == {"FastslowKeptShareFalling", "FastslowDrift"}
    for rule in shared:
        # Every replica reports the same figure of the shared log: max, never sum.
        assert "max by (task)" in rule["expr"] and "sum" not in rule["expr"]
