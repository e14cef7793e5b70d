"""What-if on gpubook's own history (issue #15 item 4): `manage.py simulate --from-history`
on the demo data, through the command an admin types."""

import csv
import datetime as dt
import io
import re

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from reservations.models import Reservation
from training.models import TrainingJob


@pytest.fixture
def demo(db, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    settings.DEBUG = True  # seed_demo refuses otherwise
    settings.GPUBOOK_DATA_ROOTS = [str(tmp_path / "datasets" / "{team}"), str(tmp_path / "datasets" / "shared")]
    call_command("seed_demo", stdout=io.StringIO())
    # The demo's week of bookings lies ahead of the seeding; look back from after it.
    latest_end = max(Reservation.objects.values_list("end", flat=True))
    return latest_end + dt.timedelta(hours=1)


def _rows(output: str) -> dict[str, dict[str, str]]:
    """The report's table rows by their first cell, each as {header: cell}."""
    rows, header = {}, None
    for line in output.splitlines():
        if not line.startswith("| "):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0] == "policy":
            header = cells
        else:
            rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def test_from_history_prints_current_and_what_if_rows_over_the_exported_jobs(demo, tmp_path):
    until = demo
    trace = tmp_path / "history.csv"
    html = tmp_path / "whatif.html"
    output = io.StringIO()
    call_command(
        "simulate", "--", "--from-history", "--since", "10d", "--until", until.isoformat(),
        "--policy", "gpubook", "--set", "max_preemptions=0", "--export-trace", str(trace),
        "--html", str(html), stdout=output,
    )
    text = output.getvalue()
    bookings = Reservation.objects.exclude(status=Reservation.Status.CANCELLED).count()
    jobs = TrainingJob.objects.count()
    summary = re.search(r"(\d+) training jobs exported \((\d+) left out\), (\d+) bookings, (\d+) jobs replayed", text)
    assert summary, text
    exported, left_out, booked, replayed = map(int, summary.groups())
    # The demo job (queued, 10 min estimate) and one replayed job per booking.
    assert (exported, left_out, booked) == (jobs, 0, bookings)
    assert replayed == exported + booked
    rows = _rows(text)
    assert list(rows) == ["current settings", "gpubook max_preemptions=0"], text
    with trace.open() as handle:
        assert len(list(csv.DictReader(handle))) == replayed
    assert html.read_text().count("<html") == 1
    for label, cells in rows.items():
        assert int(cells["jobs"]) == replayed and int(cells["completed"]) == replayed, label
        mean_wait = float(cells["mean wait s"].replace(",", ""))
        utilization, goodput = float(cells["util"]), float(cells["goodput"])
        assert 0 <= mean_wait < 3600, label  # one 10-minute job on 8 mostly idle GPUs
        assert 0 <= int(cells["no-room wait"].rstrip("%")) <= 100, label
        assert 0 < goodput <= utilization <= 1, label
        assert cells["honoured"] == "100.0%", label  # every booking honoured
        assert float(cells["quota viol"]) == 0, label


def test_from_history_refuses_an_unknown_policy_field(demo):
    with pytest.raises(CommandError, match="no field 'gap_factor'"):
        call_command("simulate", "--", "--from-history", "--until", demo.isoformat(), "--set", "gap_factor=2",
                     stdout=io.StringIO())


def test_the_admin_links_the_what_if_and_runs_it_for_the_last_days(demo, client, django_user_model):
    client.force_login(django_user_model.objects.get(username="admin"))
    changelist = client.get("/admin/training/trainingjob/")
    assert 'href="/admin/training/trainingjob/what-if/"' in changelist.content.decode()
    page = client.get("/admin/training/trainingjob/what-if/")
    assert page.status_code == 200 and "simulate --from-history" in page.content.decode()
    assert "whatif-table" not in page.content.decode()  # nothing runs until asked
    page = client.get("/admin/training/trainingjob/what-if/", {"days": 30, "policy": "fifo", "overrides": ""})
    html = page.content.decode()
    # Now (not the demo's future week): the queued demo job is the history.
    assert "1 training jobs (0 left out)" in html, html
    assert "| current settings | 1 | 1 |" in html and "| fifo | 1 | 1 |" in html
    refused = client.get("/admin/training/trainingjob/what-if/", {"days": 31, "policy": "fifo", "overrides": ""})
    assert "whatif-table" not in refused.content.decode()


def test_the_what_if_page_is_for_staff_only(demo, client, django_user_model):
    client.force_login(django_user_model.objects.get(username="alice"))
    page = client.get("/admin/training/trainingjob/what-if/", {"days": 30, "policy": "fifo"})
    assert page.status_code == 302 and "/admin/login/" in page["Location"]
