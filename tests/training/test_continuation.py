"""Jobs across slots (issue #18 item 1), tick by tick with an injected clock and the in-memory
FakeExecutor: at slot end a checkpointed job is never left on its ended booking; `then`
decides where it goes, and it resumes from its checkpoint there."""

import datetime as dt
import json
import sys

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from gpus.models import Gpu, Node
from reservations.models import Membership, Team
from reservations.services import reservation_create
from tests.fakes.executor import FakeExecutor
from tests.security.tokens import token_for
from training.models import Run, TrainingImage, TrainingJob, WaitingFor
from training.reconcile import reconcile
from training.services import job_submit

UTC = dt.UTC
MIN = dt.timedelta(minutes=1)
H = dt.timedelta(hours=1)
GRACE = 60
S = dt.datetime(2031, 3, 3, 9, 0, tzinfo=UTC)


@pytest.fixture
def world(db, tmp_path, settings):
    settings.GPUBOOK_RUNS_DIR = tmp_path / "runs"
    settings.GPUBOOK_STOP_GRACE_SECONDS = GRACE
    settings.GPUBOOK_NO_SHOW_MINUTES = 15
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    node = Node.objects.create(name="ws-1")
    gpus = [Gpu.objects.create(node=node, index=i, model_name="RTX 4090", memory_mib=24564) for i in range(2)]
    team = Team.objects.create(name="vision", slug="vision", monthly_gpu_hours=1000)
    users = {name: get_user_model().objects.create_user(username=name) for name in ("alice", "dave")}
    for user in users.values():
        Membership.objects.create(team=team, user=user)
    return {"gpus": gpus, "team": team, "fake": FakeExecutor(), **users}


def book(world, start, end, *, gpus=None, user="alice", now=None):
    return reservation_create(user=world[user], team=world["team"], gpu_ids=[g.pk for g in gpus or world["gpus"][:1]],
                              start=start, end=end, now=now or start - 3 * H)


def submit(world, *, reservation=None, gpus=1, **more):
    document = {"task_name": "long", "image": "yolo:v8n-cu118", "team": "vision", "resources": {"gpu": gpus},
                "command": [sys.executable, "-c", "pass"], "checkpointable": True, **more}
    return job_submit(user=world["alice"], document=document, now=S - 4 * H,
                      reservation_id=reservation.pk if reservation else None)


def tick(world, now):
    report = reconcile(now=now, executor=world["fake"])
    assert not report.skipped and not report.errors, report.errors
    return report


def end_first_slot_with_a_checkpoint(world, job, slot_end):
    """Run the job's slot to its end: stop at end − grace, the run checkpoints, the slot ends."""
    (run,) = Run.objects.filter(job=job, state__in=Run.LIVE)
    tick(world, slot_end - dt.timedelta(seconds=GRACE))
    checkpoint = world["fake"].checkpoint(run.pk, epoch=2)
    tick(world, slot_end - dt.timedelta(seconds=30))
    run.refresh_from_db()
    assert run.state == Run.State.CHECKPOINTED
    return run, str(checkpoint)


def test_next_booking_moves_the_job_and_it_resumes_from_its_checkpoint(world):
    first = book(world, S, S + H)
    second = book(world, S + 3 * H, S + 4 * H, gpus=world["gpus"][1:])
    job = submit(world, reservation=first)
    assert job.then == "next_booking"  # the default for a job submitted into a booking
    tick(world, S)
    _, checkpoint = end_first_slot_with_a_checkpoint(world, job, S + H)
    job.refresh_from_db()
    assert job.reservation_id == first.pk and job.state == TrainingJob.State.QUEUED  # the slot is not over yet

    report = tick(world, S + H)
    job.refresh_from_db()
    assert report.continued == {job.pk: second.pk} and job.reservation_id == second.pk
    assert tick(world, S + 2 * H).started == []  # idle GPUs in between: it waits for its booking
    report = tick(world, S + 3 * H)
    run2 = Run.objects.get(job=job, state=Run.State.RUNNING)
    assert report.started == [run2.pk] and run2.reservation_id == second.pk and run2.kind == Run.Kind.RESERVED
    assert run2.resumed_from == checkpoint
    world["fake"].finish(run2.pk)
    tick(world, S + 3 * H + 10 * MIN)
    job.refresh_from_db()
    assert job.state == TrainingJob.State.SUCCEEDED



def test_a_job_moves_through_three_bookings_resuming_each_time(world):
    slots = [book(world, S + 3 * k * H, S + (3 * k + 1) * H, gpus=world["gpus"][k % 2:k % 2 + 1]) for k in range(3)]
    job = submit(world, reservation=slots[0])
    runs, checkpoint = [], None
    for k, slot in enumerate(slots):
        if k:
            assert tick(world, slot.start - H).started == []  # idle GPUs in between: it waits for its booking
        report = tick(world, slot.start)
        run = Run.objects.get(job=job, state=Run.State.RUNNING)
        assert report.started == [run.pk] and run.reservation_id == slot.pk and run.kind == Run.Kind.RESERVED
        assert run.resumed_from == (checkpoint or "")
        runs.append(run)
        if k == len(slots) - 1:
            break
        _, checkpoint = end_first_slot_with_a_checkpoint(world, job, slot.end)
        assert tick(world, slot.end).continued == {job.pk: slots[k + 1].pk}
    world["fake"].finish(runs[-1].pk)
    tick(world, slots[-1].start + 10 * MIN)
    job.refresh_from_db()
    assert job.state == TrainingJob.State.SUCCEEDED and job.reservation_id == slots[-1].pk
    assert [run.state for run in Run.objects.filter(job=job).order_by("pk")] == [
        Run.State.CHECKPOINTED, Run.State.CHECKPOINTED, Run.State.SUCCEEDED]


def test_with_no_next_booking_it_waits_and_the_owners_new_booking_picks_it_up(world):
    first = book(world, S, S + H)
    job = submit(world, reservation=first)
    tick(world, S)
    end_first_slot_with_a_checkpoint(world, job, S + H)
    tick(world, S + H)
    job.refresh_from_db()
    assert job.reservation_id is None and job.waiting_for == WaitingFor.BOOKING
    assert tick(world, S + 2 * H).started == []  # not backfilled onto the idle GPUs

    later = book(world, S + 5 * H, S + 6 * H, now=S + 2 * H)
    report = tick(world, S + 2 * H + MIN)
    job.refresh_from_db()
    assert report.continued == {job.pk: later.pk} and job.waiting_for == WaitingFor.SLOT
    assert tick(world, S + 5 * H).started


def test_next_booking_skips_bookings_too_small_taken_or_a_teammates(world):
    first = book(world, S, S + H, gpus=world["gpus"])
    job = submit(world, reservation=first, gpus=2)
    too_small = book(world, S + 2 * H, S + 3 * H)  # one GPU
    teammates = book(world, S + 3 * H, S + 4 * H, gpus=world["gpus"], user="dave")
    taken = book(world, S + 4 * H, S + 5 * H, gpus=world["gpus"])
    other = submit(world, reservation=taken, gpus=2)
    fits = book(world, S + 5 * H, S + 6 * H, gpus=world["gpus"])
    tick(world, S)
    end_first_slot_with_a_checkpoint(world, job, S + H)
    tick(world, S + H)
    job.refresh_from_db()
    assert job.reservation_id == fits.pk
    assert {too_small.pk, teammates.pk} - {job.reservation_id} and other.reservation_id == taken.pk


def test_then_team_may_take_a_teammates_booking(world):
    first = book(world, S, S + H)
    job = submit(world, reservation=first, then_team=True)
    teammates = book(world, S + 2 * H, S + 3 * H, user="dave")
    tick(world, S)
    end_first_slot_with_a_checkpoint(world, job, S + H)
    tick(world, S + H)
    job.refresh_from_db()
    assert job.reservation_id == teammates.pk


def test_then_backfill_joins_the_queue_with_its_checkpoint(world):
    first = book(world, S, S + H)
    job = submit(world, reservation=first, then="backfill")
    tick(world, S)
    _, checkpoint = end_first_slot_with_a_checkpoint(world, job, S + H)
    report = tick(world, S + H)
    job.refresh_from_db()
    assert job.reservation_id is None and job.waiting_for == WaitingFor.SLOT
    (run2,) = Run.objects.filter(job=job, state=Run.State.RUNNING)
    assert report.started == [run2.pk] and run2.kind == Run.Kind.BACKFILL and run2.resumed_from == checkpoint


def test_then_hold_waits_for_the_user_who_attaches_it_on_the_api(world):
    first = book(world, S, S + H)
    job = submit(world, reservation=first, then="hold")
    later = book(world, S + 2 * H, S + 3 * H)
    tick(world, S)
    end_first_slot_with_a_checkpoint(world, job, S + H)
    tick(world, S + H)
    job.refresh_from_db()
    assert job.reservation_id is None and job.waiting_for == WaitingFor.USER
    assert tick(world, S + 2 * H).started == []  # held: not even its owner's next booking takes it

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_for(world['alice'])}")
    response = client.post(f"/api/v1/jobs/{job.pk}/attach/", {"reservation": later.pk}, format="json")
    assert response.status_code == 200, response.content
    job.refresh_from_db()
    assert job.reservation_id == later.pk and job.waiting_for == WaitingFor.SLOT
    assert tick(world, S + 2 * H + MIN).started


def test_a_job_never_stays_on_a_cancelled_booking(world):
    from reservations.services import reservation_cancel

    first = book(world, S + 2 * H, S + 3 * H)
    job = submit(world, reservation=first, then="backfill")
    reservation_cancel(reservation_id=first.pk, actor=world["alice"], now=S)
    tick(world, S)
    job.refresh_from_db()
    assert job.reservation_id is None and Run.objects.get(job=job).kind == Run.Kind.BACKFILL


def test_then_is_validated(world):
    from config.errors import DomainError

    with pytest.raises(DomainError) as refused:
        submit(world, then="later")
    assert "then" in [problem["field"] for problem in refused.value.extra["problems"]]


def test_attach_and_detach_on_the_job_page(world, client):
    from reservations.models import Team as TeamModel

    soon = dt.datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=2)  # pages use the clock
    later = book(world, soon, soon + H)
    job = submit(world)
    client.force_login(world["alice"])
    page = client.get(f"/jobs/{job.pk}/")
    assert page.status_code == 200 and f'value="{later.pk}"' in page.content.decode()
    assert client.post(f"/jobs/{job.pk}/attach/", {"reservation": later.pk}).status_code == 302
    job.refresh_from_db()
    assert job.reservation_id == later.pk
    assert f"booking #{later.pk} on ws-1" in client.get(f"/jobs/{job.pk}/").content.decode()
    client.post(f"/jobs/{job.pk}/attach/", {"reservation": ""})
    job.refresh_from_db()
    assert job.reservation_id is None and job.waiting_for == WaitingFor.SLOT

    outsider = get_user_model().objects.create_user(username="carol")
    Membership.objects.create(team=TeamModel.objects.create(name="nlp", slug="nlp"), user=outsider)
    client.force_login(outsider)
    assert client.post(f"/jobs/{job.pk}/attach/", {"reservation": later.pk}).status_code == 404
    job.refresh_from_db()
    assert job.reservation_id is None


def test_attach_and_detach_from_the_booking_panel_in_the_calendar(world, client):
    """The calendar's booking panel loads the booking's job section (htmx) from the training
    side; attaching and detaching there goes through the job page's own service."""
    from reservations.models import Team as TeamModel

    soon = dt.datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=2)  # pages use the clock
    booking = book(world, soon, soon + H)
    job = submit(world)
    htmx = {"HTTP_HX_REQUEST": "true"}
    client.force_login(world["alice"])
    panel = client.get(f"/reservations/{booking.pk}/", **htmx).content.decode()
    assert f'hx-get="/reservations/{booking.pk}/job/"' in panel

    section = client.get(f"/reservations/{booking.pk}/job/", **htmx).content.decode()
    assert "No job attached" in section and f'<option value="{job.pk}">long · alice' in section
    attached = client.post(f"/reservations/{booking.pk}/job/", {"job": job.pk, "action": "attach"}, **htmx)
    assert attached.status_code == 200 and "reservations-changed" in attached["HX-Trigger"]
    job.refresh_from_db()
    assert job.reservation_id == booking.pk
    assert f'Runs <a href="/jobs/{job.pk}/">long</a>' in attached.content.decode()
    assert f"booking #{booking.pk}" in client.get(f"/jobs/{job.pk}/").content.decode()  # the job page agrees
    window = {"start": soon.isoformat(), "end": (soon + H).isoformat()}
    (event,) = [event for event in client.get("/calendar/events.json", window).json()["events"]
                if event["extendedProps"].get("reservation") == booking.pk]
    assert event["title"].endswith(" · job long") and event["extendedProps"]["job"] == {"id": job.pk, "name": "long"}

    detached = client.post(f"/reservations/{booking.pk}/job/", {"job": job.pk, "action": "detach"})  # no JavaScript
    assert detached.status_code == 302 and detached["Location"] == f"/reservations/{booking.pk}/"
    job.refresh_from_db()
    assert job.reservation_id is None and job.waiting_for == WaitingFor.SLOT
    refused = client.post(f"/reservations/{booking.pk}/job/", {"job": job.pk, "action": "detach"}, **htmx)
    assert "is not attached to this booking" in refused.content.decode()

    # Another team sees neither the booking's job nor may attach its own jobs to it.
    outsider = get_user_model().objects.create_user(username="carol")
    nlp = TeamModel.objects.create(name="nlp", slug="nlp")
    Membership.objects.create(team=nlp, user=outsider)
    client.post(f"/reservations/{booking.pk}/job/", {"job": job.pk, "action": "attach"}, **htmx)
    client.force_login(outsider)
    assert client.get(f"/reservations/{booking.pk}/job/", **htmx).status_code == 404
    assert client.post(f"/reservations/{booking.pk}/job/", {"job": job.pk, "action": "detach"}).status_code == 404
    job.refresh_from_db()
    assert job.reservation_id == booking.pk
    feed = client.get("/calendar/events.json", window).json()
    (busy,) = [event for event in feed["events"] if event["extendedProps"].get("kind") == "busy"]
    assert "long" not in json.dumps(busy)
    assert busy["id"] != f"r{booking.pk}" and "reservation" not in busy["extendedProps"]
