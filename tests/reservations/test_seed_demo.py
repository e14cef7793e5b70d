"""`make run`'s demo data: what the README promises, and idempotent."""

import io

import pytest
from django.contrib.auth import authenticate
from django.core.management import call_command

from gpus.models import Gpu, Node
from reservations.models import Membership, Reservation, Team
from training.models import TrainingJob


@pytest.mark.django_db
def test_seed_demo_is_complete_and_idempotent(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    settings.DEBUG = True  # seed_demo refuses otherwise (tests/deploy/test_settings.py)
    settings.GPUBOOK_DATA_ROOTS = [str(tmp_path / "datasets" / "{team}"), str(tmp_path / "datasets" / "shared")]
    call_command("seed_demo", stdout=io.StringIO())
    counts = (Node.objects.count(), Gpu.objects.count(), Reservation.objects.count(), TrainingJob.objects.count())
    call_command("seed_demo", stdout=io.StringIO())
    assert (Node.objects.count(), Gpu.objects.count(), Reservation.objects.count(), TrainingJob.objects.count()) == counts
    assert counts[:2] == (2, 8) and counts[2] >= 20 and counts[3] == 1
    assert set(Team.objects.values_list("slug", flat=True)) == {"vision", "nlp"}
    assert Membership.objects.get(user__username="bob").role == "manager"
    for username in ("alice", "bob", "carol", "admin"):
        assert authenticate(username=username, password="gpubook-demo") is not None
    job = TrainingJob.objects.get()
    assert job.state == "queued" and (tmp_path / "datasets" / "shared" / "demo-shapes" / "data.yaml").exists()
