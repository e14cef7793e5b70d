"""Local jobs cannot read the server: a command job that reads the server's environment from
/proc/<pid>/environ (the issue's exploit) reads nothing when jobs run as GPUBOOK_JOB_USER, and
is refused outright where no job user is configured. A negative control shows the same job
does read it as the server's own user, so the test can fail."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.training.executors.conftest import make_spec, wait_until
from training.executors.base import RunState
from training.executors.local import CommandJobsRefused, LocalConfig, LocalExecutor

JOB_USER = "gpubook-job"
SECRET = "SECRET_KEY=not-for-jobs-4f1c9e"


@pytest.fixture(scope="module")
def job_user() -> str:
    try:
        pwd.getpwnam(JOB_USER)
    except KeyError:
        if os.geteuid() != 0 or not shutil.which("useradd"):
            pytest.fail(f"create the job user first: useradd --system --no-create-home {JOB_USER} (needs root)")
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", JOB_USER],
                       check=True)
    if os.geteuid() != 0 and not shutil.which("sudo"):
        pytest.fail("the scheduler must be root or have a sudo rule for the job user (README)")
    return JOB_USER


@pytest.fixture
def server():
    """A stand-in for the web server: a process whose environment holds a secret."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                               env={"PATH": os.environ.get("PATH", ""), "SECRET_KEY": SECRET.split("=", 1)[1]})
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def base_dir():
    # Under /tmp directly: pytest's own tmp_path is closed (0700) to other users.
    path = Path(tempfile.mkdtemp(prefix="gpubook-isolation-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def snoop_spec(base_dir: Path, server_pid: int, run_id: int):
    script = (
        "import os\n"
        f"for pid in ({server_pid}, {os.getpid()}):\n"
        "    try:\n"
        "        data = open(f'/proc/{pid}/environ', 'rb').read().replace(b'\\0', b'\\n').decode()\n"
        "        print('READ', pid, data, flush=True)\n"
        "    except OSError as error:\n"
        "        print('REFUSED', pid, type(error).__name__, flush=True)\n"
        "print('uid', os.getuid(), 'cwd', os.getcwd(), flush=True)\n"
        "for key in ('DATABASE_URL', 'SECRET_KEY', 'GPUBOOK_VAR_DIR'):\n"
        "    print('env', key, os.environ.get(key, '<unset>'), flush=True)\n"
    )
    return make_spec(run_id=run_id, image="local", argv=[sys.executable, "-I", "-c", script],
                     must_end_by=datetime.now(UTC) + timedelta(minutes=5), grace_s=5,
                     output_dir=str(base_dir / "runs" / str(run_id)), workdir=str(Path.cwd()))


def run_to_end(executor: LocalExecutor, spec) -> str:
    handle = executor.start(spec)
    wait_until(lambda: next(o for o in executor.observe() if o.run_id == spec.run_id).state is not RunState.RUNNING,
               timeout=30)
    return executor.log_tail(handle, lines=200)


def test_a_job_as_the_job_user_reads_nothing_of_the_server(job_user, server, base_dir):
    executor = LocalExecutor(LocalConfig(state_dir=base_dir / "executor", job_user=job_user))
    log = run_to_end(executor, snoop_spec(base_dir, server.pid, run_id=1))
    assert f"REFUSED {server.pid} PermissionError" in log, log
    assert f"REFUSED {os.getpid()} PermissionError" in log, log
    assert "not-for-jobs" not in log and "READ" not in log
    assert f"uid {pwd.getpwnam(job_user).pw_uid} " in log
    assert f"cwd {base_dir / 'runs' / '1'}" in log  # its own folder, not the checkout
    assert "env DATABASE_URL <unset>" in log and "env SECRET_KEY <unset>" in log
    assert (base_dir / "executor").stat().st_mode & 0o077 == 0  # other runs' specs closed to it


def test_negative_control_as_the_servers_user_the_job_reads_the_secret(server, base_dir):
    executor = LocalExecutor(LocalConfig(state_dir=base_dir / "executor"))  # the single-user setup
    log = run_to_end(executor, snoop_spec(base_dir, server.pid, run_id=2))
    assert "not-for-jobs" in log  # exactly what the isolation above prevents


def test_without_a_job_user_command_jobs_are_refused_and_the_trainer_is_not(base_dir):
    executor = LocalExecutor(LocalConfig(state_dir=base_dir / "executor", refuse_commands=True))
    with pytest.raises(CommandJobsRefused, match="GPUBOOK_JOB_USER"):
        executor.start(snoop_spec(base_dir, os.getpid(), run_id=3))
    trainer = make_spec(run_id=4, image="local", argv=[sys.executable, "-m", "training.runner", "--help"],
                        must_end_by=datetime.now(UTC) + timedelta(minutes=5), grace_s=5)
    executor.start(trainer)  # not refused


@pytest.mark.django_db
def test_submitting_a_command_job_is_refused_with_a_clear_error(people, inventory, settings):
    from rest_framework.test import APIClient

    settings.GPUBOOK_SINGLE_USER, settings.GPUBOOK_JOB_USER, settings.GPUBOOK_EXECUTOR = False, "", "local"
    settings.GPUBOOK_DATA_ROOTS = ["/data/{team}"]
    client = APIClient()
    client.force_authenticate(people["owner"])
    spec = {"task_name": "t", "image": "yolo:v8n-cu118", "team": "vision", "command": ["python", "train.py"]}
    response = client.post("/api/v1/jobs/", {"spec": spec}, format="json")
    assert response.status_code == 403 and response.json()["code"] == "command_jobs_refused"
    assert "GPUBOOK_JOB_USER" in response.json()["detail"]
