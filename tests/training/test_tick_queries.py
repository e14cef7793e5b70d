"""A no-op tick's SQL does not grow with the queue or the bookings (issue #19 item 2): the
"waiting too long" notices are decided in one query, and the snapshot reads plain rows."""

import datetime as dt
import sys

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from config.scheduling import policy_from_settings
from gpus.models import Gpu, Node
from notifications.models import Notice
from reservations.models import Membership, Team
from reservations.services import reservation_create
from tests.fakes.executor import FakeExecutor
from training.models import TrainingImage
from training.reconcile import reconcile
from training.services import job_submit
from training.snapshot import build_snapshot

H = dt.timedelta(hours=1)
S = dt.datetime(2031, 3, 3, 9, 0, tzinfo=dt.UTC)


@pytest.fixture
def world(db, settings):
    settings.GPUBOOK_QUEUE_WAIT_NOTICE_MINUTES = 60
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    node = Node.objects.create(name="ws-1")
    gpus = [Gpu.objects.create(node=node, index=i, model_name="RTX 4090", memory_mib=24564) for i in range(2)]
    team = Team.objects.create(name="vision", slug="vision", monthly_gpu_hours=10_000)
    user = get_user_model().objects.create_user(username="alice")
    Membership.objects.create(team=team, user=user)
    return {"gpus": gpus, "team": team, "user": user}


def submit(world, count, reservation=None):
    Gpu.objects.filter(pk__in=[gpu.pk for gpu in world["gpus"]]).update(state=Gpu.State.ACTIVE)
    for number in range(count):
        job_submit(user=world["user"], now=S - 4 * H, reservation_id=reservation.pk if reservation else None,
                   document={"task_name": f"job {number}", "image": "yolo:v8n-cu118", "team": "vision",
                             "command": [sys.executable, "-c", "pass"]})
    Gpu.objects.filter(pk__in=[gpu.pk for gpu in world["gpus"]]).update(state=Gpu.State.DRAINED)  # nothing starts


def queries_of(function) -> int:
    with CaptureQueriesContext(connection) as captured:
        function()
    return len(captured.captured_queries)


def test_a_no_op_tick_costs_the_same_with_3_or_15_queued_jobs(world):
    executor = FakeExecutor()
    submit(world, 3)
    reconcile(now=S, executor=executor)  # the three are told they wait
    assert Notice.objects.filter(event_type="job.waiting").count() == 3
    small = queries_of(lambda: reconcile(now=S + H, executor=executor))
    submit(world, 12)
    reconcile(now=S + 2 * H, executor=executor)
    assert Notice.objects.filter(event_type="job.waiting").count() == 15  # each told once
    large = queries_of(lambda: reconcile(now=S + 3 * H, executor=executor))
    assert large == small and executor.calls == []


def test_the_snapshot_costs_the_same_with_2_or_8_bookings(world):
    policy = policy_from_settings()

    def book_with_a_job(hour):
        Gpu.objects.filter(pk=world["gpus"][0].pk).update(state=Gpu.State.ACTIVE)
        reservation = reservation_create(user=world["user"], team=world["team"], gpu_ids=[world["gpus"][0].pk],
                                         start=S + hour * H, end=S + (hour + 1) * H, now=S - 5 * H)
        submit(world, 1, reservation=reservation)

    for hour in range(2):
        book_with_a_job(hour)
    small = queries_of(lambda: build_snapshot(now=S, policy=policy))
    for hour in range(2, 8):
        book_with_a_job(hour)
    snapshot = build_snapshot(now=S, policy=policy)
    assert len(snapshot.reservations) == 8 and all(item.job_id for item in snapshot.reservations)
    assert queries_of(lambda: build_snapshot(now=S, policy=policy)) == small
