"""The embedded scheduler loop stops cleanly on SIGTERM, after the tick under way."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from django.conf import settings
from django.db import connection

from training.loop import StopRequest, run_until_stopped


def test_sigterm_during_a_tick_lets_it_finish_then_stops_the_loop():
    steps = []

    def run_once() -> float:
        steps.append("tick begins")
        os.kill(os.getpid(), signal.SIGTERM)  # a real signal, mid-tick
        time.sleep(0.05)  # the handler has run by now; the tick carries on regardless
        steps.append("tick ends")
        return 60.0  # a long sleep that the stop cuts short

    with StopRequest.on_signals() as stop:
        began = time.monotonic()
        ticks = run_until_stopped(run_once=run_once, stop=stop)
    assert ticks == 1 and steps == ["tick begins", "tick ends"]
    assert time.monotonic() - began < 5
    assert signal.getsignal(signal.SIGTERM) is not stop._on_signal  # the old handler is back


def test_sigterm_while_sleeping_stops_within_a_moment():
    with StopRequest.on_signals() as stop:
        began = time.monotonic()
        threading.Timer(0.2, os.kill, args=(os.getpid(), signal.SIGTERM)).start()
        stop.sleep(30)
    assert stop.requested and 0.2 <= time.monotonic() - began < 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_manage_py_scheduler_exits_0_on_sigterm(postgres_only, tmp_path):
    database = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/{database['NAME']}",
        "GPUBOOK_VAR_DIR": str(tmp_path / "var"), "GPUBOOK_TICK_SECONDS": "30", "GPUBOOK_TELEMETRY_LOCAL": "false",
        "DJANGO_SETTINGS_MODULE": "config.settings", "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "scheduler.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "scheduler"], env=env, stdout=out, stderr=subprocess.STDOUT,
            cwd=settings.BASE_DIR, start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 60
            while "scheduler:" not in log.read_text():
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "the scheduler did not start"
                time.sleep(0.1)
            time.sleep(1)  # into its first tick or the sleep after it (tick every 30 s)
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=20)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    output = log.read_text()
    assert code == 0, output
    assert "scheduler: stopped after 1 tick(s)" in output
    assert "Traceback" not in output
