"""deploy/prometheus: the scrape config points at /metrics and every metric the alert rules
name is one /metrics really exports (read from a real render, not a list kept by hand)."""

import re

import pytest
import yaml
from django.urls import resolve
from django.utils import timezone

from gpus.metrics import metrics_view, render_metrics
from tests.deploy.conftest import DEPLOY

PROMETHEUS = DEPLOY / "prometheus"
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


@pytest.fixture
def exported(db, inventory) -> dict[str, str]:
    """Metric family name → type, from a real /metrics render."""
    text = render_metrics(now=timezone.now()).decode()
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def unknown_names(expr: str, exported: dict[str, str]) -> set[str]:
    missing = set()
    for name in set(re.findall(r"\bgpubook_[a-z0-9_]+\b", expr)):
        if name in exported and exported[name] not in SUFFIXES:
            continue
        if any(
            name == family + suffix for family, kind in exported.items() for suffix in SUFFIXES.get(kind, ())
        ):
            continue
        missing.add(name)
    return missing


def rules() -> list[dict]:
    document = yaml.safe_load((PROMETHEUS / "alerts.yaml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_every_alert_names_exported_metrics(exported):
    problems = {rule["alert"]: unknown_names(rule["expr"], exported) for rule in rules()}
    assert not any(problems.values()), problems


def test_the_check_catches_a_wrong_name(exported):
    """Negative controls: a typo, and a histogram suffix on a gauge."""
    assert unknown_names("gpubook_scheduler_lag_secs > 1", exported) == {"gpubook_scheduler_lag_secs"}
    assert unknown_names("gpubook_scheduler_lag_seconds_sum > 1", exported) == {"gpubook_scheduler_lag_seconds_sum"}


def test_the_promised_alerts_exist():
    exprs = {rule["alert"]: " ".join(rule["expr"].split()) for rule in rules()}
    joined = " | ".join(exprs.values())
    assert "gpubook_scheduler_lag_seconds" in joined  # tick lag
    assert "gpubook_scheduler_tick_duration_seconds_sum" in joined and "gpubook_scheduler_tick_interval_seconds / 3" in joined
    assert "gpubook_slot_start_lateness_seconds_bucket" in joined  # slot-start lateness
    assert 'gpubook_notification_deliveries{state="failed"}' in joined  # failed deliveries
    assert "gpubook_gpu_temperature_celsius" in joined  # GPU temperature
    for rule in rules():
        assert rule["labels"]["severity"] in {"warning", "critical"} and rule["annotations"]["summary"]


def test_scrape_config_points_at_metrics():
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yaml"]
    (job,) = config["scrape_configs"]
    assert resolve(job["metrics_path"]).func is metrics_view
    assert job["authorization"]["type"] == "Bearer"  # /metrics wants the token from outside


@pytest.mark.django_db
def test_failed_deliveries_and_tick_interval_are_exported(settings, people):
    from notifications.models import Delivery, Notice

    settings.GPUBOOK_TICK_SECONDS = 7
    now = timezone.now()
    notice = Notice.objects.create(event_type=Notice._meta.get_field("event_type").choices[0][0], occurred_at=now)
    for state in ("failed", "failed", "delivered"):
        Delivery.objects.create(notice=notice, channel="email", user=people["owner"], target="a@example.com",
                                state=state, next_attempt_at=now, created_at=now)
    text = render_metrics(now=now).decode()
    assert 'gpubook_notification_deliveries{channel="email",state="failed"} 2.0' in text
    assert 'gpubook_notification_deliveries{channel="webhook",state="failed"} 0.0' in text
    assert "gpubook_scheduler_tick_interval_seconds 7.0" in text
