"""Priority preemption through reconcile (issue #18 item 3), tick by tick with an injected
clock and the in-memory FakeExecutor: an urgent job that cannot start stops a low-priority
backfill run that has run its minimum time; the stopped job is queued again with its
checkpoint, and its owner is told at once which job took the GPUs — another team's job only
by its priority and team, as the queue page shows it."""

import datetime as dt
import sys

import pytest
from django.contrib.auth import get_user_model

import scheduler
from config.scheduling import policy_from_settings
from gpus.models import Gpu, Node
from notifications.models import EventType, Notice
from reservations.models import Membership, Team
from tests.fakes.executor import FakeExecutor
from training.models import Run, TrainingImage, TrainingJob
from training.queue import queue_estimates_refresh
from training.reconcile import reconcile
from training.services import job_submit

UTC = dt.UTC
MIN = dt.timedelta(minutes=1)
HOUR = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)
S = dt.datetime(2031, 3, 3, 9, 0, tzinfo=UTC)


@pytest.fixture
def world(db, tmp_path, settings):
    settings.GPUBOOK_RUNS_DIR = tmp_path / "runs"
    settings.GPUBOOK_STOP_GRACE_SECONDS = 60
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    add_gpus(Node.objects.create(name="ws-1"), range(2))
    teams = {slug: Team.objects.create(name=slug, slug=slug, monthly_gpu_hours=1000) for slug in ("vision", "nlp")}
    people = {}
    for name, slug in (("alice", "vision"), ("dave", "vision"), ("bob", "nlp")):
        people[name] = get_user_model().objects.create_user(username=name, email=f"{name}@example.org")
        Membership.objects.create(team=teams[slug], user=people[name])
    return {"fake": FakeExecutor(), **people}


def add_gpus(node, indices) -> None:
    for index in indices:
        Gpu.objects.create(node=node, index=index, model_name="RTX 4090", memory_mib=24564)


def submit(world, who, name, *, team, priority, at, gpus=2):
    document = {"task_name": name, "image": "yolo:v8n-cu118", "team": team, "resources": {"gpu": gpus},
                "command": [sys.executable, "-c", "pass"], "checkpointable": True, "priority": priority}
    return job_submit(user=world[who], document=document, now=at)


def tick(world, now):
    report = reconcile(now=now, executor=world["fake"])
    assert not report.skipped and not report.errors, report.errors
    return report


def preempted_notices():
    return list(Notice.objects.filter(event_type=EventType.RUN_PREEMPTED))


@pytest.mark.parametrize(("taker", "team", "named"), [
    ("bob", "nlp", "an urgent job of team nlp"),
    ("dave", "vision", "the urgent job “hotfix” (#{id})"),
])
def test_an_urgent_job_preempts_a_low_backfill_run_and_its_owner_is_told_why(world, taker, team, named):
    low = submit(world, "alice", "sweep", team="vision", priority="low", at=S - MIN)
    tick(world, S)
    (run,) = Run.objects.filter(job=low, state=Run.State.RUNNING)
    assert run.kind == Run.Kind.BACKFILL

    urgent = submit(world, taker, "hotfix", team=team, priority="urgent", at=S + 5 * MIN)
    assert tick(world, S + 10 * MIN).stopped == []  # the low run has not had its 15 minutes yet
    assert preempted_notices() == []

    report = tick(world, S + 15 * MIN)
    assert report.stopped == [run.pk]
    run.refresh_from_db()
    reason = named.format(id=urgent.pk)
    assert run.state == Run.State.STOPPING and reason in run.reason
    (notice,) = preempted_notices()
    assert notice.payload["job"] == {"id": low.pk, "name": "sweep"} and reason in notice.payload["reason"]
    assert list(notice.deliveries.values_list("user__username", flat=True)) == ["alice"]
    if team != "vision":  # another team's job name never reaches this team
        assert "hotfix" not in str(notice.payload) and f"#{urgent.pk}" not in notice.payload["reason"]

    checkpoint = world["fake"].checkpoint(run.pk, epoch=3)
    tick(world, S + 16 * MIN)
    low.refresh_from_db()
    assert low.state == TrainingJob.State.QUEUED and low.checkpoint_path == str(checkpoint)
    assert low.times_preempted == 1
    tick(world, S + 17 * MIN)
    assert Run.objects.get(job=urgent).state in Run.LIVE
    assert len(preempted_notices()) == 1  # told once, though reconcile ticks on


def test_long_waiting_jobs_get_a_checkpointable_run_stopped_and_its_owner_is_told(world):
    """Queue relief through reconcile: alice's 4-GPU run holds the node; after an hour, four
    1-GPU jobs of bob's fit its GPUs (relief_min_jobs is 4 by default; the world's node has 2
    GPUs, so two more are added)."""
    add_gpus(Gpu.objects.first().node, (2, 3))
    sweep = submit(world, "alice", "sweep", team="vision", priority="medium", at=S - MIN, gpus=4)
    tick(world, S)
    (run,) = Run.objects.filter(job=sweep, state=Run.State.RUNNING)
    waiting = [submit(world, "bob", f"probe-{n}", team="nlp", priority="medium", at=S + 5 * MIN, gpus=1)
               for n in range(4)]
    assert tick(world, S + 64 * MIN).stopped == []  # not an hour yet
    assert preempted_notices() == []

    report = tick(world, S + 65 * MIN)
    assert report.stopped == [run.pk]
    run.refresh_from_db()
    assert run.state == Run.State.STOPPING and "Queued jobs have waited" in run.reason
    (notice,) = preempted_notices()
    assert notice.payload["job"] == {"id": sweep.pk, "name": "sweep"}
    assert list(notice.deliveries.values_list("user__username", flat=True)) == ["alice"]

    world["fake"].checkpoint(run.pk, epoch=2)
    tick(world, S + 66 * MIN)
    sweep.refresh_from_db()
    assert sweep.state == TrainingJob.State.QUEUED and sweep.times_preempted == 1
    tick(world, S + 67 * MIN)
    assert all(Run.objects.get(job=job).state in Run.LIVE for job in waiting)

    # The sweep resumes when they finish; it has given way once, so a second wave of
    # long-waiting jobs does not stop it again (the snapshot carries times_preempted).
    for job in waiting:
        world["fake"].finish(Run.objects.get(job=job).pk)
    tick(world, S + 70 * MIN)
    (resumed,) = Run.objects.filter(job=sweep, state__in=Run.LIVE)
    for n in range(4):
        submit(world, "bob", f"probe-again-{n}", team="nlp", priority="medium", at=S + 71 * MIN, gpus=1)
    assert tick(world, S + 140 * MIN).stopped == []
    resumed.refresh_from_db()
    assert resumed.state == Run.State.RUNNING and len(preempted_notices()) == 1


def test_relief_stops_recorded_this_week_spend_its_budget(world):
    """Relief's budget as reconcile reads it from the database: two runs relieved in the last
    week (their reason is relief's sentence) and a handful of jobs submitted allow no third
    stop until the older of the two is a week old."""
    node = Gpu.objects.first().node
    add_gpus(node, (2, 3))
    earlier = submit(world, "alice", "earlier", team="vision", priority="medium", at=S - 6 * DAY, gpus=1)
    for stopped_at in (S - 7 * DAY + 2 * HOUR, S - DAY):
        Run.objects.create(
            job=earlier, kind=Run.Kind.BACKFILL, node=node, gpu_ids=[1], gpu_indices=[0],
            state=Run.State.CHECKPOINTED, reason=scheduler.Reason.QUEUE_RELIEF.sentence,
            created_at=stopped_at - HOUR, started_at=stopped_at - HOUR, stop_requested_at=stopped_at,
            ended_at=stopped_at + MIN, must_end_by=stopped_at + DAY,
        )
    TrainingJob.objects.filter(pk=earlier.pk).update(state=TrainingJob.State.SUCCEEDED)
    sweep = submit(world, "alice", "sweep", team="vision", priority="medium", at=S - MIN, gpus=4)
    tick(world, S)
    (run,) = Run.objects.filter(job=sweep, state=Run.State.RUNNING)
    for n in range(4):
        submit(world, "bob", f"probe-{n}", team="nlp", priority="medium", at=S + 5 * MIN, gpus=1)
    assert tick(world, S + 65 * MIN).stopped == []  # an hour waited, but the budget is spent
    assert tick(world, S + 2 * HOUR - MIN).stopped == []
    assert tick(world, S + 2 * HOUR).stopped == [run.pk]  # the older stop is a week old
    assert len(preempted_notices()) == 1


@pytest.mark.parametrize("drain_minutes", [60, 0])
def test_the_oldest_whole_node_job_gets_a_node_drained_and_kept_for_it(world, settings, drain_minutes):
    """Queue drain through reconcile: four 1-GPU runs of alice's fill two 2-GPU nodes; bob's
    2-GPU job (a whole node here) waits. After an hour, both runs on one node checkpoint for
    it (within relief's budget: 400 jobs queued this week), their owner is told, and on the
    tick they leave, bob's job starts on that node while the requeued runs wait. With
    `GPUBOOK_QUEUE_DRAIN_MINUTES=0` the drain is off and nothing is stopped."""
    settings.GPUBOOK_QUEUE_DRAIN_MINUTES = drain_minutes
    add_gpus(Node.objects.create(name="ws-2"), range(2))
    sweeps = [submit(world, "alice", f"sweep-{n}", team="vision", priority="medium", at=S - MIN, gpus=1)
              for n in range(4)]
    tick(world, S)
    assert Run.objects.filter(state=Run.State.RUNNING).count() == 4
    # 400 finished jobs queued this week (copies of a sweep): floor(4) + 2 stops for relief.
    fields = {field.attname: getattr(sweeps[0], field.attname) for field in TrainingJob._meta.concrete_fields}
    fields.update(id=None, state=TrainingJob.State.SUCCEEDED)
    TrainingJob.objects.bulk_create([TrainingJob(**fields) for _ in range(400)])
    wide = submit(world, "bob", "wide", team="nlp", priority="medium", at=S + 5 * MIN, gpus=2)
    assert tick(world, S + 64 * MIN).stopped == []  # not an hour yet

    report = tick(world, S + 65 * MIN)
    if not drain_minutes:
        assert report.stopped == [] and preempted_notices() == []
        return
    drained = list(Run.objects.filter(pk__in=report.stopped))
    assert len(drained) == 2 and len({run.node_id for run in drained}) == 1
    assert all(run.state == Run.State.STOPPING and run.stopped_for_id == wide.pk for run in drained)
    assert all(run.reason == scheduler.Reason.QUEUE_DRAIN.sentence for run in drained)
    assert sorted(notice.payload["job"]["id"] for notice in preempted_notices()) == sorted(
        run.job_id for run in drained
    )
    # The queue page, refreshed after the tick as the loop does, tells bob why and when: the
    # node is drained for his job, which starts once the runs have had their grace.
    queue_estimates_refresh(now=S + 65 * MIN, policy=policy_from_settings())
    wide.refresh_from_db()
    assert wide.wait_reason == scheduler.WaitReason.NODE_DRAINING.sentence
    assert wide.estimated_start == S + 65 * MIN + dt.timedelta(seconds=policy_from_settings().grace_s)

    for run in drained:
        world["fake"].checkpoint(run.pk, epoch=2)
    tick(world, S + 66 * MIN)
    tick(world, S + 67 * MIN)
    (started,) = Run.objects.filter(job=wide, state__in=Run.LIVE)
    assert started.node_id == drained[0].node_id
    requeued = TrainingJob.objects.filter(pk__in=[run.job_id for run in drained])
    assert all(job.state == TrainingJob.State.QUEUED and job.times_preempted == 1 for job in requeued)
    # Once bob's job runs, its drains are no longer read back: nothing else is held or drained.
    assert tick(world, S + 3 * HOUR).stopped == []


@pytest.mark.parametrize(("allowance", "drained"), [(2, 0), (6, 2)])
def test_a_small_cluster_gets_the_drain_by_raising_the_stop_allowance(world, settings, allowance, drained):
    """Five jobs queued this week: relief's budget is floor(0.05) + the allowance, and the drain
    leaves relief four of it. At the default allowance (2) bob's whole-node job waits; with
    `GPUBOOK_QUEUE_STOP_ALLOWANCE=6` the two runs on one node are stopped for it."""
    settings.GPUBOOK_QUEUE_STOP_ALLOWANCE = allowance
    add_gpus(Node.objects.create(name="ws-2"), range(2))
    for n in range(4):
        submit(world, "alice", f"sweep-{n}", team="vision", priority="medium", at=S - MIN, gpus=1)
    tick(world, S)
    submit(world, "bob", "wide", team="nlp", priority="medium", at=S + 5 * MIN, gpus=2)
    stopped = Run.objects.filter(pk__in=tick(world, S + 65 * MIN).stopped)
    assert len(stopped) == drained
    assert all(run.reason == scheduler.Reason.QUEUE_DRAIN.sentence for run in stopped)


def test_a_drain_is_read_back_only_while_its_job_has_not_run_since(world):
    """`build_snapshot`'s drains: a drain stop for a queued job is read back with its GPUs; once
    that job has had a run after the drain (it started, was stopped and is queued again), the
    drain is no longer its."""
    from training.snapshot import build_snapshot

    node = Gpu.objects.first().node
    wide = submit(world, "bob", "wide", team="nlp", priority="medium", at=S - 2 * HOUR, gpus=2)
    victim = submit(world, "alice", "victim", team="vision", priority="medium", at=S - 3 * HOUR, gpus=2)
    gpu_ids = list(Gpu.objects.filter(node=node).order_by("index").values_list("pk", flat=True))
    Run.objects.create(
        job=victim, kind=Run.Kind.BACKFILL, node=node, gpu_ids=gpu_ids, gpu_indices=[0, 1],
        state=Run.State.CHECKPOINTED, reason=scheduler.Reason.QUEUE_DRAIN.sentence, stopped_for=wide,
        created_at=S - 3 * HOUR, started_at=S - 3 * HOUR, stop_requested_at=S - HOUR, ended_at=S - HOUR + MIN,
        must_end_by=S + DAY,
    )
    policy = scheduler.Policy()
    (drain,) = build_snapshot(now=S, policy=policy).drains
    assert (drain.at, drain.job_id, drain.gpu_ids) == (S - HOUR, wide.pk, tuple(gpu_ids))
    assert len(build_snapshot(now=S, policy=policy).relief_history.stops) == 1  # relief's budget counts it

    Run.objects.create(
        job=wide, kind=Run.Kind.BACKFILL, node=node, gpu_ids=gpu_ids, gpu_indices=[0, 1],
        state=Run.State.CHECKPOINTED, created_at=S - 50 * MIN, started_at=S - 50 * MIN,
        ended_at=S - 10 * MIN, must_end_by=S + DAY,
    )
    assert build_snapshot(now=S, policy=policy).drains == ()
