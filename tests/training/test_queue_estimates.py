"""The queue as people read it (training/queue.py): reconcile stores each queued job's
position, estimated start and why it waits, from the scheduler's own plan rolled forward;
the job API, the job page and the queue page read the stored figures."""

import datetime as dt

from django.contrib.auth import get_user_model

from reservations.models import Membership, Team
from tests.support import client_for
from tests.training.test_reconcile_ticks import START, command_spec, submit, tick, world  # noqa: F401
from training.models import Run, TrainingJob

H = dt.timedelta(hours=1)


def whole_node(name, duration):
    return command_spec(name, resources={"gpu": 2}, estimated_duration=duration)


def test_a_tick_stores_position_estimated_start_and_reason(world):  # noqa: F811
    first = submit(world, whole_node("first", "60m"))
    second = submit(world, whole_node("second", "30m"))
    third = submit(world, whole_node("third", "30m"))

    tick(world, START)
    (run,) = Run.objects.all()
    assert run.job_id == first.pk
    second.refresh_from_db()
    third.refresh_from_db()
    # Both GPUs are busy for the first job's hour; then the second, then the third.
    assert (second.queue_position, third.queue_position) == (1, 2)
    assert second.estimated_start == START + H
    assert third.estimated_start == START + H + dt.timedelta(minutes=30)
    assert "running jobs" in second.wait_reason and "ranked ahead" in third.wait_reason
    assert second.estimated_at == START


def test_estimates_are_refreshed_on_their_interval_and_for_new_jobs(world, settings):  # noqa: F811
    settings.GPUBOOK_QUEUE_ESTIMATE_SECONDS = 30
    submit(world, whole_node("first", "60m"))
    second = submit(world, whole_node("second", "30m"))
    tick(world, START)
    tick(world, START + dt.timedelta(seconds=10))
    second.refresh_from_db()
    assert second.estimated_at == START  # fresh enough: not re-planned

    late = submit(world, whole_node("late", "30m"), now=START + dt.timedelta(seconds=15))
    tick(world, START + dt.timedelta(seconds=20))
    late.refresh_from_db()
    second.refresh_from_db()
    assert late.estimated_at == second.estimated_at == START + dt.timedelta(seconds=20)
    assert late.queue_position == 2


def test_api_job_page_and_queue_page_show_the_estimate_anonymised_for_others(world):  # noqa: F811
    submit(world, whole_node("first", "60m"))
    second = submit(world, whole_node("secret-experiment", "30m"))
    tick(world, START)

    owner = client_for(world["user"], api=True)
    body = owner.get(f"/api/v1/jobs/{second.pk}/").json()
    assert body["queue_position"] == 1 and body["estimated_start"].startswith("2031-03-03T10:00")
    assert "running jobs" in body["wait_reason"]

    page = client_for(world["user"]).get(f"/jobs/{second.pk}/").content.decode()
    assert "position 1" in page and "estimated start" in page

    other_team = Team.objects.create(name="nlp", slug="nlp", monthly_gpu_hours=10)
    outsider = get_user_model().objects.create_user(username="carol")
    Membership.objects.create(team=other_team, user=outsider)
    theirs = client_for(outsider).get("/queue/").content.decode()
    ours = client_for(world["user"]).get("/queue/").content.decode()
    assert "secret-experiment" in ours and "secret-experiment" not in theirs
    assert theirs.count("another team's job") == 1  # the queued one; the running job is not queued
    assert TrainingJob.objects.filter(state=TrainingJob.State.QUEUED).count() == 1
