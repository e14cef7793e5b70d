"""The `gpubook` CLI end to end: the real program in a subprocess against a live server (the
same Django app on a loopback port), with personas and a small inventory. Nothing is faked
between the command line and the database."""

import datetime as dt
import json
import os
import queue
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from tests.security.tokens import token_for
from training.executors.base import Handle, run_name
from training.models import Run, TrainingImage, TrainingJob

CLI_ROOT = Path(__file__).resolve().parents[2] / "cli"
UTC = dt.UTC


@pytest.fixture
def gpubook(live_server, tmp_path):
    """Run `gpubook ARGS…` as a separate process with its own config dir."""
    base_env = {
        **os.environ,
        "PYTHONPATH": str(CLI_ROOT),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "GPUBOOK_URL": live_server.url,
        "COLUMNS": "200",
    }
    base_env.pop("GPUBOOK_TOKEN", None)

    def run(*args: str, env: dict | None = None, check: bool = True, stdin: str | None = None):
        result = subprocess.run(
            [sys.executable, "-m", "gpubook_cli", *args], env={**base_env, **(env or {})}, input=stdin,
            capture_output=True, text=True, timeout=60,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"gpubook {' '.join(args)} exited {result.returncode}: {result.stderr}")
        return result

    run.env = base_env
    run.config_file = tmp_path / "config" / "gpubook" / "config.json"
    return run


def login(gpubook, username: str) -> None:
    gpubook("login", "--username", username, "--password", f"pw-{username}")


def json_of(result) -> object:
    return json.loads(result.stdout)


@pytest.mark.django_db(transaction=True)
def test_login_saves_a_private_token_and_errors_print_the_server_detail(gpubook, people, inventory):
    refused = gpubook("login", "--username", "alice", "--password", "wrong", check=False)
    assert refused.returncode == 1
    assert "Unknown username or wrong password." in refused.stderr
    assert not gpubook.config_file.exists()

    not_logged_in = gpubook("gpus", check=False)
    assert not_logged_in.returncode != 0 and "gpubook login" in not_logged_in.stderr

    login(gpubook, "alice")
    assert stat.S_IMODE(gpubook.config_file.stat().st_mode) == 0o600
    saved = json.loads(gpubook.config_file.read_text())
    assert saved["url"] == gpubook.env["GPUBOOK_URL"] and saved["token"].startswith("gpb_")

    listed = json_of(gpubook("gpus", "--json"))
    assert [(g["node"], g["index"]) for g in listed] == [("node-a", i) for i in range(4)] + [("node-b", 0), ("node-b", 1)]
    table = gpubook("gpus").stdout
    assert "NVIDIA A100" in table and "node-b" in table

    # GPUBOOK_TOKEN overrides the saved token: a bad one is refused by the server.
    overridden = gpubook("gpus", env={"GPUBOOK_TOKEN": "0" * 40}, check=False)
    assert overridden.returncode == 1 and "Invalid, expired or revoked token" in overridden.stderr

    # Unreachable server: its own exit code and a sentence, not a traceback.
    gone = gpubook("gpus", env={"GPUBOOK_URL": "http://127.0.0.1:9"}, check=False)
    assert gone.returncode == 3 and "cannot reach" in gone.stderr and "Traceback" not in gone.stderr


@pytest.mark.django_db(transaction=True)
def test_free_book_list_cancel(gpubook, people, inventory, future_day):
    login(gpubook, "alice")
    a = inventory["a"]
    nine = future_day + dt.timedelta(hours=9)
    # Someone already holds GPUs 0-2 of node-a from 09:00 to 11:00.
    gpubook("book", "--gpu", str(a[0].pk), "--gpu", str(a[1].pk), "--gpu", str(a[2].pk),
            "--start", nine.isoformat(), "--hours", "2", "--team", "vision")

    # 2 GPUs for 4 h from 09:00: node-a has only GPU 3 free until 11:00, node-b has both now.
    slots = json_of(gpubook("free", "--gpus", "2", "--hours", "4", "--from", nine.isoformat(), "--days", "1",
                            "--json"))
    assert slots[0] == {"node": "node-b", "start": nine.isoformat(), "end": (nine + dt.timedelta(hours=4)).isoformat(),
                        "gpus": [inventory["b"][0].pk, inventory["b"][1].pk]}
    eleven = nine + dt.timedelta(hours=2)
    assert {"node": "node-a", "start": eleven.isoformat(), "end": (eleven + dt.timedelta(hours=4)).isoformat(),
            "gpus": [a[0].pk, a[1].pk]} in slots
    # Three on node-b can never fit: only node-a qualifies, after the booking ends.
    three = json_of(gpubook("free", "--gpus", "3", "--hours", "1", "--from", nine.isoformat(), "--days", "1",
                            "--json"))
    assert three[0]["node"] == "node-a" and three[0]["start"] == eleven.isoformat()

    booked = json_of(gpubook("book", "--gpu", str(a[0].pk), "--gpu", str(a[1].pk), "--start", eleven.isoformat(),
                             "--hours", "4", "--json"))  # alice has one team: no --team needed
    assert booked["status"] == "confirmed" and booked["gpus"] == [a[0].pk, a[1].pk]

    clash = gpubook("book", "--gpu", str(a[1].pk), "--start", eleven.isoformat(), "--hours", "1", check=False)
    assert clash.returncode == 1 and "collides with 1 existing booking" in clash.stderr

    mine = json_of(gpubook("ls", "--json"))
    assert [r["id"] for r in mine] == sorted(r["id"] for r in mine) and booked["id"] in [r["id"] for r in mine]
    assert "node-a" in gpubook("ls").stdout

    cancelled = gpubook("cancel", str(booked["id"]), "--reason", "plans changed")
    assert f"#{booked['id']} is now cancelled" in cancelled.stdout
    again = gpubook("cancel", str(booked["id"]), check=False)
    assert again.returncode == 1 and "cannot be cancelled" in again.stderr

    # The outsider cannot see, let alone cancel, vision's booking.
    gpubook.config_file.unlink()
    login(gpubook, "carol")
    foreign = gpubook("release", str(mine[0]["id"]), check=False)
    assert foreign.returncode == 1 and foreign.stderr.strip()


@pytest.mark.django_db(transaction=True)
def test_book_count_lets_the_server_choose_around_running_work(gpubook, people, inventory, future_day):
    from tests.reservations.test_booking_placement import _backfill

    login(gpubook, "alice")
    a, b = inventory["a"], inventory["b"]
    ten = future_day + dt.timedelta(hours=10)
    gpubook("book", "--gpu", str(a[2].pk), "--gpu", str(a[3].pk), "--start", ten.isoformat(), "--hours", "2")
    # node-a's other two GPUs: one holds a run that cannot checkpoint (all its work at risk
    # if its estimate is wrong); node-b, as free, is where the booking should go.
    _backfill(people, a[0], checkpointable=False, history=True)
    booked = json_of(gpubook("book", "--count", "2", "--start", ten.isoformat(), "--hours", "2", "--json"))
    assert booked["gpus"] == [b[0].pk, b[1].pk]
    both = gpubook("book", "--count", "1", "--gpu", str(a[0].pk), "--start", ten.isoformat(), "--hours", "1",
                   check=False)
    assert both.returncode == 2 and "one of the two" in both.stderr
    full = gpubook("book", "--count", "3", "--start", ten.isoformat(), "--hours", "2", check=False)
    assert full.returncode == 1 and "No node has 3 GPUs free" in full.stderr


@pytest.mark.django_db(transaction=True)
def test_submit_jobs_queue(gpubook, people, inventory, future_day, tmp_path):
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    login(gpubook, "alice")
    data = Path(settings.GPUBOOK_DATA_ROOTS[0].replace("{team}", "vision")) / "shapes" / "data.yaml"
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        "task_name: detector\nimage: yolo:v8n-cu118\nteam: vision\npriority: high\n"
        f"yolo: {{model: yolov8n.yaml, data: {data}, epochs: 3, imgsz: 64, batch: 4}}\n"
    )
    queued = json_of(gpubook("submit", str(job_file), "--json"))
    assert queued["state"] == "queued" and queued["reservation"] is None

    booking = json_of(gpubook("book", "--gpu", str(inventory["a"][0].pk), "--start",
                              (future_day + dt.timedelta(hours=9)).isoformat(), "--hours", "2", "--json"))
    attached = gpubook("submit", str(job_file), "--into", str(booking["id"]))
    assert f"in booking #{booking['id']}" in attached.stdout

    bad = tmp_path / "bad.yaml"
    bad.write_text("task_name: x\nimage: evil:latest\nteam: vision\ncommand: rm -rf /\n")
    refused = gpubook("submit", str(bad), check=False)
    assert refused.returncode == 1
    assert "image: 'evil:latest' is not an allowed image" in refused.stderr  # one line per problem
    assert TrainingJob.objects.count() == 2

    seed = tmp_path / "seed.yaml"  # the Ultralytics command-line form teams bring along
    seed.write_text('task_name: pcb\nimage: yolo:v8n-cu118\nuser: vision\n'
                    'command: "yolo train data=pcb_defect.yaml model=yolov8n.yaml epochs=5 imgsz=64"\n')
    from_seed = json_of(gpubook("submit", str(seed), "--json"))
    assert from_seed["spec"]["yolo"]["data"] == str(data.parent.parent / "pcb_defect.yaml")
    assert from_seed["epochs_total"] == 5

    listed = json_of(gpubook("jobs", "--json"))
    assert sorted(j["id"] for j in listed) == sorted([queued["id"], from_seed["id"], attached_id(listed, booking["id"])])
    in_queue = {j["id"]: j for j in json_of(gpubook("queue", "--json"))}
    assert in_queue.keys() == {j["id"] for j in listed}
    # The job waiting for a booking starts with it; the backfill queue has no estimate in the API.
    assert in_queue[attached_id(listed, booking["id"])]["estimated_start"] == booking["start"]
    assert in_queue[queued["id"]]["estimated_start"] is None and in_queue[from_seed["id"]]["estimated_start"] is None

    # The order is the scheduler's stored queue position (fair share), not one the CLI re-derives
    # from priority: the later, medium-priority job is first when the scheduler says so.
    TrainingJob.objects.filter(pk=from_seed["id"]).update(queue_position=1)
    TrainingJob.objects.filter(pk=queued["id"]).update(queue_position=2)
    order = [j["id"] for j in json_of(gpubook("queue", "--json"))]
    assert order == [from_seed["id"], queued["id"], attached_id(listed, booking["id"])]


def attached_id(jobs: list[dict], booking_id: int) -> int:
    return next(j["id"] for j in jobs if j["reservation"] == booking_id)


def make_run(*, user, inventory, state: str, progress: dict, epochs_total: int = 10) -> Run:
    image = TrainingImage.objects.create(name="yolo", tag=f"t{Run.objects.count()}")
    now = timezone.now()
    job = TrainingJob.objects.create(
        team=user.memberships.first().team, user=user, name="detector", image=image, spec={}, submitted_at=now,
        state=TrainingJob.State.RUNNING, epochs_total=epochs_total,
    )
    gpu = inventory["a"][0]
    run = Run.objects.create(
        job=job, kind=Run.Kind.BACKFILL, node=gpu.node, gpu_ids=[gpu.pk], gpu_indices=[gpu.index], state=state,
        created_at=now, started_at=now, must_end_by=now + dt.timedelta(hours=1), progress=progress,
    )
    # As the local executor's start() would have recorded it: the log is found through the handle.
    run.handle = Handle(run_id=run.pk, name=run_name(run.pk), executor="local").as_dict()
    run.save(update_fields=["handle"])
    return run


def log_path(run: Run) -> Path:
    path = Path(settings.VAR_DIR) / "executor" / "logs" / f"{run_name(run.pk)}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.django_db(transaction=True)
def test_logs_follow_prints_each_line_once_until_the_run_ends(gpubook, people, inventory):
    login(gpubook, "alice")
    run = make_run(user=people["owner"], inventory=inventory, state=Run.State.RUNNING, progress={})
    path = log_path(run)
    path.write_text("line 1\nline 2\n")
    follower = subprocess.Popen(
        [sys.executable, "-m", "gpubook_cli", "logs", "-f", str(run.pk), "--interval", "0.2"],
        env=gpubook.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in follower.stdout], daemon=True)
    reader.start()

    def next_line() -> str:
        try:
            return lines.get(timeout=30)  # a poll every 0.2 s: 30 s only on a very loaded machine
        except queue.Empty:
            raise AssertionError("`gpubook logs -f` printed nothing new within 30 s") from None

    try:
        assert next_line() == "line 1\n"
        assert next_line() == "line 2\n"
        with path.open("a") as log:
            log.write("line 3\n")
        assert next_line() == "line 3\n"  # printed by a later poll
        with path.open("a") as log:
            log.write("line 4\n")
        Run.objects.filter(pk=run.pk).update(state=Run.State.SUCCEEDED, ended_at=timezone.now())
        assert follower.wait(timeout=30) == 0, follower.stderr.read()
    finally:
        follower.kill()
    reader.join(timeout=10)
    rest = []
    while not lines.empty():
        rest.append(lines.get())
    assert rest == ["line 4\n"]  # once, whichever poll caught it

    outsider = gpubook("logs", str(run.pk), env={"GPUBOOK_TOKEN": login_token(gpubook, "carol")}, check=False)
    assert outsider.returncode == 1 and "Not found" in outsider.stderr


def login_token(gpubook, username: str) -> str:
    return token_for(get_user_model().objects.get(username=username))


@pytest.mark.django_db(transaction=True)
def test_status_shows_epoch_progress(gpubook, people, inventory):
    login(gpubook, "alice")
    run = make_run(user=people["owner"], inventory=inventory, state=Run.State.RUNNING,
                   progress={"event": "epoch", "epoch": 3, "mAP50": 0.41})
    live = gpubook("status", str(run.pk), "--once")
    assert "3/10" in live.stdout and "mAP50=0.41" in live.stdout and "running" in live.stdout

    Run.objects.filter(pk=run.pk).update(state=Run.State.CHECKPOINTED, ended_at=timezone.now(), reason="slot ended")
    ended = gpubook("status", str(run.pk))  # follows, and returns at once because the run is over
    assert f"Run #{run.pk} checkpointed" in ended.stdout and "slot ended" in ended.stdout
    as_json = json_of(gpubook("status", str(run.pk), "--json"))
    assert as_json["run"]["state"] == "checkpointed" and as_json["job"]["epochs_total"] == 10
