"""The runner ignores every SIGTERM after the first while it saves and exits — including
during interpreter shutdown, where a Python-level handler would already be gone."""

import signal
import subprocess
import sys
import time

from training.runner.exitcodes import EXIT_CHECKPOINTED
from training.runner.stop import GracefulStop

PROGRAM = """
import sys, time
from training.runner.stop import GracefulStop
stop = GracefulStop(stop_at=None).install_signal_handlers()
print("ready", flush=True)
while not stop.requested():
    time.sleep(0.01)
print("saving", flush=True)
stop.saving.set(); time.sleep(0.5); stop.saving.clear()  # the checkpoint
time.sleep(0.5)  # writing the termination message, closing loaders
sys.exit(75)
"""


def test_repeated_sigterms_never_kill_a_stopping_runner():
    child = subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGTERM)
        assert child.stdout.readline().strip() == "saving"
        while child.poll() is None:  # a SIGTERM every 10 ms until it has exited, shutdown included
            child.send_signal(signal.SIGTERM)
            time.sleep(0.01)
        assert child.returncode == EXIT_CHECKPOINTED
    finally:
        child.kill()
        child.wait()


def test_a_stop_by_the_clock_leaves_the_process_signals_alone_unless_installed():
    before = signal.getsignal(signal.SIGTERM)
    stop = GracefulStop(stop_at=1.0, clock=lambda: 2.0)
    assert stop.requested() and stop.reason == "must_end_by"
    assert signal.getsignal(signal.SIGTERM) is before
