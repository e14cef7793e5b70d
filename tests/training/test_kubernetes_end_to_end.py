"""Reconcile drives the Kubernetes executor end to end, with real parts: the real `kubernetes`
client against the wire-level fake API server, whose fake kubelet runs each Job's container
as a local process (the real runner training Ultralytics on the demo dataset, or a stand-in
command), turns pod deletes into SIGTERM then SIGKILL after the grace, and reports exit codes
and termination messages in the pod status.

Reconcile ticks get an injected `now` (the slots lie tomorrow), so no test waits for a slot
edge; the waits are for the processes themselves (training, checkpointing, exiting)."""

import datetime as dt
import json
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from gpus.models import Gpu, Node
from notifications.models import EventType, Notice
from reservations.models import Membership, Reservation, Team
from reservations.services import reservation_create
from tests.fakes.k8s_api import FakeKubelet, FakeKubernetes
from tests.support import wait_for
from training.execution import kubernetes_config_from_settings
from training.executors.kubernetes import KubernetesExecutor
from training.models import Run, RunMetric, TrainingImage, TrainingJob
from training.reconcile import reconcile
from training.runner.dataset import make_demo_dataset
from training.services import job_cancel, job_submit

pytestmark = [pytest.mark.training, pytest.mark.django_db(transaction=True)]
H = dt.timedelta(hours=1)
MIN = dt.timedelta(minutes=1)
GRACE = 30  # seconds between SIGTERM and SIGKILL (real seconds on the fake kubelet)
NS = "gpubook-vision"
DIGEST = "sha256:" + "ab" * 32
STAND_IN = str(Path(__file__).resolve().parents[1] / "fakes" / "slot_recorder.py")  # exits 75 on SIGTERM
IGNORES_SIGTERM = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(0.05)\n"




class World:
    def __init__(self, tmp_path: Path, settings, live_server):
        settings.GPUBOOK_BASE_URL = live_server.url
        settings.GPUBOOK_RUNS_DIR = tmp_path / "runs"
        settings.GPUBOOK_DATA_ROOTS = [str(tmp_path / "data" / "{team}")]
        settings.GPUBOOK_STOP_GRACE_SECONDS = GRACE
        settings.GPUBOOK_RUNNER_WORKERS = 0
        settings.GPUBOOK_K8S_IMAGE_PULL_SECRETS = "*=gpubook-registry"
        self.tmp_path = tmp_path
        TrainingImage.objects.update_or_create(name="yolo", tag="v8n-cu118", defaults={"digest": DIGEST})
        node = Node.objects.create(name="gpu-node-1")
        self.gpu = Gpu.objects.create(node=node, index=0, model_name="CPU stand-in", memory_mib=1024)
        self.team = Team.objects.create(name="vision", slug="vision", monthly_gpu_hours=1000)
        self.user = get_user_model().objects.create_user(username="alice", email="alice@example.com")
        Membership.objects.create(team=self.team, user=self.user)
        self.start = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=1)
        (tmp_path / "data" / "vision").mkdir(parents=True)
        self.kubelet = FakeKubelet(
            tmp_path / "kubelet",
            volumes={"gpubook-runs": settings.GPUBOOK_RUNS_DIR, "gpubook-data": tmp_path / "data"},
            # Slows the tiny training so that the stop lands while it trains (runner test hook).
            extra_env={"GPUBOOK_RUNNER_BATCH_DELAY_S": "0.2"},
        )
        self.fake = FakeKubernetes(kubelet=self.kubelet).start()
        self.clock_skew = dt.timedelta(0)  # what the executor's clock is ahead of the cluster's
        self.executor = self.new_scheduler()

    def new_scheduler(self) -> KubernetesExecutor:
        """The executor a (re)started scheduler builds: nothing carried over but settings."""
        return KubernetesExecutor(
            kubernetes_config_from_settings(), client_configuration=self.fake.client_configuration(),
            clock=lambda: dt.datetime.now(dt.UTC) + self.clock_skew,
        )

    def tick(self, now):
        report = reconcile(now=now, executor=self.executor)
        assert not report.skipped
        return report

    def book(self, offset_h: float, hours: float = 1) -> Reservation:
        start = self.start + offset_h * H
        return reservation_create(user=self.user, team=self.team, gpu_ids=[self.gpu.pk], start=start,
                                  end=start + hours * H, now=self.start - 2 * H)

    def submit(self, reservation: Reservation, **document) -> TrainingJob:
        return job_submit(user=self.user, now=self.start - H, reservation_id=reservation.pk, document={
            "task_name": "shapes", "image": "yolo:v8n-cu118", "team": "vision", "checkpointable": True, **document,
        })

    def job_requests(self, method):
        return self.fake.requests_for(method, rf"^/apis/batch/v1/namespaces/{NS}/jobs")

    def pod_deletes(self):
        return self.fake.requests_for("DELETE", rf"^/api/v1/namespaces/{NS}/pods/")

    def close(self):
        self.fake.stop()


@pytest.fixture
def world(tmp_path, settings, live_server):
    world = World(tmp_path, settings, live_server)
    yield world
    world.close()
    assert not world.kubelet.errors  # the fake itself worked as documented


def test_a_booked_job_checkpoints_at_slot_end_and_resumes_in_the_next_booking(world):
    data_yaml = make_demo_dataset(world.tmp_path / "data" / "vision" / "shapes", train_images=8, val_images=4,
                                  imgsz=64, seed=3)
    first, second = world.book(0), world.book(2)
    job = world.submit(first, yolo={"model": "yolov8n.yaml", "data": str(data_yaml), "epochs": 2, "imgsz": 64,
                                    "batch": 4, "extra": {"plots": False}})
    end = first.end

    # Slot start: the Job is created, pinned by digest, and its pod runs the real runner.
    assert world.tick(world.start - MIN).started == []
    report = world.tick(world.start)
    run = Run.objects.get()
    assert report.started == [run.pk] and not report.errors
    [create] = world.job_requests("POST")
    pod_spec = create.body["spec"]["template"]["spec"]
    assert pod_spec["containers"][0]["image"] == f"yolo@{DIGEST}"
    assert pod_spec["imagePullSecrets"] == [{"name": "gpubook-registry"}]
    assert pod_spec["terminationGracePeriodSeconds"] == GRACE
    assert create.body["spec"]["activeDeadlineSeconds"] == 3600  # the backstop: the slot's end
    wait_for(lambda: [pod["status"]["phase"] for pod in world.fake.pods_of(NS, f"gpubook-run-{run.pk}")] == ["Running"],
             what="the pod running")
    wait_for(lambda: RunMetric.objects.filter(run=run, event="epoch").exists(), what="a first epoch reported")
    assert world.tick(world.start + 10 * MIN).stopped == []  # mid-slot: nothing to do

    # end − grace: suspend, and the pod deleted with the grace; the runner checkpoints, exits 75.
    report = world.tick(end - dt.timedelta(seconds=GRACE))
    assert report.stopped == [run.pk]
    assert_stopped_with_grace(world)
    assert world.pod_deletes()  # the runner takes seconds to save: its pod was still there to delete
    [ended] = wait_for(lambda: world.kubelet.terminations, what="the runner to exit")
    assert ended.exit_code == 75 and ended.sigkill_at is None
    message = json.loads(ended.message)  # the termination message, as the kubelet reported it
    assert message["status"] == "checkpointed" and message["run_id"] == str(run.pk)
    wait_for(lambda: not world.fake.pods_of(NS, f"gpubook-run-{run.pk}"), what="the pod to go")

    report = world.tick(end - dt.timedelta(seconds=GRACE - 5))
    assert report.ended == [run.pk]
    run.refresh_from_db()
    job.refresh_from_db()
    assert run.state == Run.State.CHECKPOINTED, run.reason
    assert run.checkpoint_path == message["checkpoint"] and Path(run.checkpoint_path).is_file()
    assert job.state == TrainingJob.State.QUEUED and job.checkpoint_path == run.checkpoint_path
    assert world.fake.job(NS, f"gpubook-run-{run.pk}") is None  # cleaned up after recording

    # The slot is over: the job moves to its owner's next booking (then: next_booking), where a
    # new Job resumes from that checkpoint and finishes.
    world.tick(end)
    job.refresh_from_db()
    assert job.then == "next_booking" and job.reservation_id == second.pk
    report = world.tick(second.start)
    resumed = Run.objects.exclude(pk=run.pk).get()
    assert report.started == [resumed.pk]
    assert resumed.resumed_from == run.checkpoint_path
    wait_for(lambda: len(world.kubelet.terminations) == 2, timeout=240, what="the resumed run to finish")
    assert world.kubelet.terminations[1].exit_code == 0
    report = world.tick(second.start + 20 * MIN)
    assert resumed.pk in report.ended
    resumed.refresh_from_db()
    job.refresh_from_db()
    assert resumed.state == Run.State.SUCCEEDED and job.state == TrainingJob.State.SUCCEEDED
    assert job.epochs_done == 2
    first_epochs = list(RunMetric.objects.filter(run=run, event="epoch").values_list("epoch", flat=True))
    later_epochs = list(RunMetric.objects.filter(run=resumed, event="epoch").values_list("epoch", flat=True))
    assert later_epochs and later_epochs[0] > 1 and later_epochs[-1] == 2, (first_epochs, later_epochs)
    assert len(world.job_requests("POST")) == 2  # one Job per slot


def assert_stopped_with_grace(world):
    """The stop on the wire: the Job suspended (its controller then deletes the pod with the
    pod's grace) and the pod deleted with the grace; when the process checkpointed faster than
    the executor listed pods, there is no pod left to delete."""
    [suspend] = world.job_requests("PATCH")
    assert suspend.body == {"spec": {"suspend": True}}
    assert all(request.query.get("gracePeriodSeconds") == str(GRACE) for request in world.pod_deletes())


def stand_in_job(world, reservation, argv):
    return world.submit(reservation, command=argv)


def test_cancel_mid_run_stops_the_pod_with_the_grace(world):
    booking = world.book(0)
    events = world.tmp_path / "runs" / "vision" / "cancel.jsonl"
    events.parent.mkdir(parents=True, exist_ok=True)
    job = stand_in_job(world, booking, [sys.executable, STAND_IN, str(events)])
    world.tick(world.start)
    run = Run.objects.get()
    wait_for(lambda: events.is_file() and "started" in events.read_text(), what="the stand-in to start")

    job_cancel(job_id=job.pk, actor=world.user, now=world.start + 5 * MIN)
    world.tick(world.start + 5 * MIN)  # delivers the stop
    assert_stopped_with_grace(world)
    [ended] = wait_for(lambda: world.kubelet.terminations, what="the stand-in to exit")
    assert ended.exit_code == 75 and "sigterm" in events.read_text()
    wait_for(lambda: not world.fake.pods_of(NS, f"gpubook-run-{run.pk}"), what="the pod to go")
    world.tick(world.start + 6 * MIN)
    run.refresh_from_db()
    job.refresh_from_db()
    assert run.state in (Run.State.KILLED, Run.State.CHECKPOINTED) and run.ended_at is not None
    assert "cancelled by alice" in run.reason
    assert job.state == TrainingJob.State.CANCELLED


def test_a_run_ignoring_sigterm_is_killed_at_slot_end(world):
    booking = world.book(0)
    program = world.tmp_path / "runs" / "vision" / "stubborn.py"
    program.parent.mkdir(parents=True, exist_ok=True)
    program.write_text(IGNORES_SIGTERM)
    job = stand_in_job(world, booking, [sys.executable, str(program)])
    world.tick(world.start)
    run = Run.objects.get()
    wait_for(lambda: world.kubelet.processes(), what="the process to start")

    world.tick(booking.end - dt.timedelta(seconds=GRACE))  # stop: SIGTERM, which it ignores
    wait_for(lambda: [sigterm for sigterm, _ in world.kubelet.signals().values() if sigterm], what="SIGTERM")
    world.tick(booking.end - dt.timedelta(seconds=GRACE - 10))
    assert Run.objects.get().state == Run.State.STOPPING and world.kubelet.processes()  # still in its grace

    report = world.tick(booking.end)  # the grace is over: kill
    assert report.killed == [run.pk]
    assert world.pod_deletes()[-1].query.get("gracePeriodSeconds") == "0"
    [ended] = wait_for(lambda: world.kubelet.terminations, what="SIGKILL")
    assert ended.exit_code == 137 and ended.sigterm_at is not None and ended.sigkill_at is not None
    world.tick(booking.end + MIN)
    run.refresh_from_db()
    assert run.state == Run.State.KILLED, run.reason
    job.refresh_from_db()
    assert job.state == TrainingJob.State.QUEUED  # resumable in a later slot


def test_a_restarted_scheduler_adopts_the_job_it_finds_by_label(world, monkeypatch):
    booking = world.book(0)
    events = world.tmp_path / "runs" / "vision" / "adopt.jsonl"
    events.parent.mkdir(parents=True, exist_ok=True)
    stand_in_job(world, booking, [sys.executable, STAND_IN, str(events)])

    # The scheduler dies right after the Job was created, before it recorded the handle.
    def crash(**_):
        raise KeyboardInterrupt("scheduler killed")

    monkeypatch.setattr("training.launch.run_handle_record", crash)
    with pytest.raises(KeyboardInterrupt):
        world.tick(world.start)
    monkeypatch.undo()
    run = Run.objects.get()
    assert run.state == Run.State.STARTING and not run.handle
    wait_for(lambda: events.is_file(), what="the pod to run")

    world.executor = world.new_scheduler()  # a fresh process: no memory of what it started
    report = world.tick(world.start + MIN)
    assert report.started == [] and not report.errors
    assert len(world.job_requests("POST")) == 1  # adopted, not started again
    run.refresh_from_db()
    job = world.fake.job(NS, f"gpubook-run-{run.pk}")
    assert run.state == Run.State.RUNNING
    assert run.handle["namespace"] == NS and run.handle["uid"] == job["metadata"]["uid"]

    world.executor = world.new_scheduler()  # and once more, mid-run, with the handle stored
    assert world.tick(world.start + 30 * MIN).stopped == []
    world.tick(booking.end - dt.timedelta(seconds=GRACE))
    [ended] = wait_for(lambda: world.kubelet.terminations, what="the stand-in to exit")
    assert ended.exit_code == 75
    assert len(world.job_requests("POST")) == 1


def test_a_pod_stuck_pulling_its_image_fails_the_run_and_frees_the_slot(world):
    booking = world.book(0, hours=2)
    job = stand_in_job(world, booking, [sys.executable, STAND_IN, str(world.tmp_path / "never.jsonl")])
    world.kubelet.hold("*", "ImagePullBackOff",
                       f'Back-off pulling image "yolo@{DIGEST}": unauthorized: authentication required')
    world.tick(world.start)
    run = Run.objects.get()
    wait_for(lambda: world.fake.pods_of(NS, f"gpubook-run-{run.pk}"), what="the pod")
    assert world.tick(world.start + MIN).ended == []  # within the patience: it may still come up

    world.clock_skew = dt.timedelta(minutes=3, seconds=5)  # the cluster's pod is now 3 minutes old
    report = world.tick(world.start + 4 * MIN)
    assert report.ended == [run.pk] and report.released == [booking.pk]
    run.refresh_from_db()
    job.refresh_from_db()
    booking.refresh_from_db()
    assert run.state == Run.State.FAILED
    assert run.reason.startswith(f"image yolo@{DIGEST} could not be pulled: Back-off pulling image")
    assert job.state == TrainingJob.State.FAILED
    assert world.fake.job(NS, f"gpubook-run-{run.pk}") is None  # the Job is deleted
    assert booking.status == Reservation.Status.RELEASED and booking.end < world.start + 2 * H
    notice = Notice.objects.get(event_type=EventType.RUN_FAILED)
    assert notice.payload["reason"] == run.reason and notice.deliveries.filter(user=world.user).exists()
    assert not world.kubelet.terminations  # nothing ever ran
