"""The queue as people read it (training/queue.py): the scheduler tick stores each queued
job's position, estimated start and why it waits, from the scheduler's own plan rolled
forward; the job API, the job page and the queue page read the stored figures."""

import datetime as dt

from django.contrib.auth import get_user_model

from reservations.models import Membership, Team
from tests.support import client_for
from tests.training.test_reconcile_ticks import START, command_spec, submit, world  # noqa: F401
from training.loop import scheduler_tick
from training.models import Run, TrainingJob

H = dt.timedelta(hours=1)


def tick(world, now):  # noqa: F811
    """The real caller: the loop's tick (reconcile, watchdog, then the estimates when due)."""
    report = scheduler_tick(now=now, executor=world["executor"])
    assert not report.skipped and not report.errors, report.errors
    return report


def whole_node(name, duration):
    return command_spec(name, resources={"gpu": 2}, estimated_duration=duration)


def test_a_tick_stores_position_estimated_start_and_reason(world):  # noqa: F811
    # Equal lengths, so submit order decides (size lanes would start shorter jobs first).
    first = submit(world, whole_node("first", "60m"))
    second = submit(world, whole_node("second", "60m"))
    third = submit(world, whole_node("third", "60m"))

    tick(world, START)
    (run,) = Run.objects.all()
    assert run.job_id == first.pk
    second.refresh_from_db()
    third.refresh_from_db()
    # Both GPUs are busy for the first job's hour; then the second, then the third.
    assert (second.queue_position, third.queue_position) == (1, 2)
    assert second.estimated_start == START + H
    assert third.estimated_start == START + 2 * H
    assert "running jobs" in second.wait_reason and "ranked ahead" in third.wait_reason
    assert second.estimated_at == START


def test_estimates_are_refreshed_on_their_interval_and_for_new_jobs(world, settings):  # noqa: F811
    settings.GPUBOOK_QUEUE_ESTIMATE_SECONDS = 30
    submit(world, whole_node("first", "60m"))
    second = submit(world, whole_node("second", "60m"))
    tick(world, START)
    tick(world, START + dt.timedelta(seconds=10))
    second.refresh_from_db()
    assert second.estimated_at == START  # fresh enough: not re-planned

    late = submit(world, whole_node("late", "60m"), now=START + dt.timedelta(seconds=15))
    tick(world, START + dt.timedelta(seconds=20))
    late.refresh_from_db()
    second.refresh_from_db()
    assert late.estimated_at == second.estimated_at == START + dt.timedelta(seconds=20)
    assert late.queue_position == 2


def test_a_job_past_the_estimate_budget_is_stored_as_not_before(world, settings):  # noqa: F811
    settings.GPUBOOK_QUEUE_ESTIMATE_BUDGET = 1  # one plan with the one job left queued
    submit(world, whole_node("first", "60m"))
    second = submit(world, whole_node("second", "60m"))
    tick(world, START)  # the first job starts; the roll-forward stops when its hour ends
    second.refresh_from_db()
    assert second.estimated_start is None
    assert second.estimate_not_before == START + H  # the time reached: a lower bound

    body = client_for(world["user"], api=True).get(f"/api/v1/jobs/{second.pk}/").json()
    assert body["estimated_start"] is None and body["estimate_not_before"] is not None
    page = client_for(world["user"]).get(f"/jobs/{second.pk}/").content.decode()
    assert "no start found yet: not before" in page
    assert "not before" in client_for(world["user"]).get("/queue/").content.decode()


def test_api_job_page_and_queue_page_show_the_estimate_anonymised_for_others(world):  # noqa: F811
    submit(world, whole_node("first", "60m"))
    second = submit(world, whole_node("secret-experiment", "60m"))
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



def test_the_submit_form_shows_the_estimate_the_scheduler_then_stores(world):  # noqa: F811
    """The preview runs the stored-estimate rule for the spec as typed; submitting it and the
    next tick store the same start. Nothing is written by the preview."""
    import yaml
    from django.utils import timezone

    now = timezone.now().replace(microsecond=0)  # pages read the clock
    submit(world, whole_node("first", "60m"), now=now)
    tick(world, now)  # the first job holds both GPUs for its hour
    draft = yaml.safe_dump(whole_node("draft", "30m"))
    client = client_for(world["user"])
    jobs_before = TrainingJob.objects.count()
    shown = client.post("/jobs/estimate/", {"spec_yaml": draft, "reservation": ""}, HTTP_HX_REQUEST="true")
    assert shown.status_code == 200 and TrainingJob.objects.count() == jobs_before
    text = " ".join(shown.content.decode().split())
    local = timezone.localtime(now + H, timezone.get_current_timezone())
    assert f"Estimated start: <strong>{local:%a} {local.day} {local:%b %H:%M}</strong> (in 59 min" in text \
        or f"Estimated start: <strong>{local:%a} {local.day} {local:%b %H:%M}</strong> (in 1 h 00 min" in text
    assert "position 1 in the queue" in text and "Predicted runtime: <strong>30 min</strong> (your estimate)" in text

    # Without JavaScript the "check" button shows it too; a broken spec says why there is none.
    page = client.post("/jobs/", {"spec_yaml": draft, "reservation": "", "action": "check"}).content.decode()
    assert "position 1 in the queue" in page
    broken = client.post("/jobs/estimate/", {"spec_yaml": "task_name: [", "reservation": ""}).content.decode()
    assert "No estimate yet" in broken

    job = submit(world, whole_node("draft", "30m"), now=now)
    tick(world, now + dt.timedelta(seconds=1))
    job.refresh_from_db()
    assert job.estimated_start == now + H and job.queue_position == 1


def test_the_submit_form_says_not_before_when_the_estimate_stops_short(world, settings):  # noqa: F811
    """Past the estimate's budget the draft gets no start but the time the roll-forward
    reached, in words: here one plan (now) starts nothing, and nothing changes before the
    running job's predicted end."""
    import yaml
    from django.utils import timezone

    settings.GPUBOOK_QUEUE_ESTIMATE_BUDGET = 1  # one plan with the draft queued
    now = timezone.now().replace(microsecond=0)  # pages read the clock
    submit(world, whole_node("first", "60m"), now=now)
    tick(world, now)  # the first job holds both GPUs for its hour
    shown = client_for(world["user"]).post(
        "/jobs/estimate/", {"spec_yaml": yaml.safe_dump(whole_node("draft", "30m")), "reservation": ""}
    ).content.decode()
    text = " ".join(shown.split())
    local = timezone.localtime(now + H, timezone.get_current_timezone())
    assert f"<strong>not before {local:%a} {local.day} {local:%b %H:%M}</strong> (in " in text
    assert "position 1 in the queue; the estimate looks no further ahead." in text
    assert "Estimated start" not in text

    settings.GPUBOOK_QUEUE_ESTIMATE_BUDGET = 2  # one more plan reaches that end: a start
    shown = client_for(world["user"]).post(
        "/jobs/estimate/", {"spec_yaml": yaml.safe_dump(whole_node("draft", "30m")), "reservation": ""}
    ).content.decode()
    assert "Estimated start" in shown and "not before" not in shown


def test_the_submit_form_estimate_for_a_booking_is_its_start(world):  # noqa: F811
    import yaml
    from django.utils import timezone

    from tests.training.test_reconcile_ticks import book

    soon = timezone.now().replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=1)
    booking = book(world, soon, soon + H)
    shown = client_for(world["user"]).post(
        "/jobs/estimate/", {"spec_yaml": yaml.safe_dump(command_spec("draft")), "reservation": booking.pk}
    ).content.decode()
    assert f"Starts with booking #{booking.pk}" in shown and "(in 2" in shown
    assert "no history and no estimate: the scheduler&#x27;s default" in shown or "scheduler's default" in shown


# --- runtime prediction (training/runtime.py) -------------------------------------------------
def finish(world, job, hours):  # noqa: F811
    """Record `job` as having run `hours` and succeeded, as reconcile would."""
    started = START - 10 * H
    Run.objects.create(
        job=job, kind=Run.Kind.BACKFILL, node=world["gpus"][0].node, gpu_ids=[world["gpus"][0].pk], gpu_indices=[0],
        created_at=started, started_at=started, ended_at=started + hours * H, must_end_by=started + 24 * H,
        state=Run.State.SUCCEEDED,
    )
    TrainingJob.objects.filter(pk=job.pk).update(state=TrainingJob.State.SUCCEEDED, finished_at=started + hours * H)


def test_runtime_predicted_from_similar_history_then_user_then_default(world):  # noqa: F811
    fresh = submit(world, command_spec("fresh"))
    assert (fresh.predicted_duration_s, fresh.runtime_source) == (None, "default")
    told = submit(world, command_spec("told", estimated_duration="90m"))
    assert (told.predicted_duration_s, told.runtime_source) == (90 * 60, "user")

    finish(world, fresh, hours=3)
    finish(world, told, hours=5)  # same argv and image: both are "similar"
    again = submit(world, command_spec("again", estimated_duration="10m"))
    assert again.runtime_source == "history" and again.predicted_duration_s == 4 * 3600  # mean of the last two

    page = client_for(world["user"]).get(f"/jobs/{again.pk}/").content.decode()
    assert "from your recent runs of similar jobs" in page


def test_the_scheduler_plans_with_the_prediction_not_the_optimistic_estimate(world):  # noqa: F811
    earlier = submit(world, whole_node("whole", "10m"))
    finish(world, earlier, hours=4)
    blocker = submit(world, whole_node("whole", "10m"))  # says ten minutes; its history says four hours
    behind = submit(world, whole_node("behind", "30m"))
    assert (blocker.runtime_source, blocker.predicted_duration_s) == ("history", 4 * 3600)

    tick(world, START)
    assert Run.objects.get(state__in=Run.LIVE).job_id == blocker.pk
    behind.refresh_from_db()
    assert behind.estimated_start == START + 4 * H
