"""The production processes for tests and benchmarks: gunicorn serving config.wsgi with
DEBUG=false and hashed static files collected first (WhiteNoise), a Celery worker and beat on
Redis. Everything binds 127.0.0.1 on a port the kernel picks; gunicorn gets the listening
socket itself (`--bind fd://N`), so no port is guessed and none can be taken in between."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def production_env(*, database_url: str, redis_url: str, var_dir: Path, static_root: Path, origin: str = "",
                   **extra: str) -> dict[str, str]:
    """What deploy/production.env sets, minus TLS (the test talks plain HTTP to 127.0.0.1)."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DEBUG": "false",
        "SECRET_KEY": secrets.token_urlsafe(48),
        "SECRET_KEY_MIN_LENGTH": "50",
        "ALLOWED_HOSTS": "127.0.0.1",
        "CSRF_TRUSTED_ORIGINS": origin,
        "GPUBOOK_BASE_URL": origin or "http://127.0.0.1",
        "SESSION_COOKIE_SECURE": "false",  # plain HTTP on loopback; production sets TLS in front
        "CSRF_COOKIE_SECURE": "false",
        "GPUBOOK_STATIC_MANIFEST": "true",
        "STATIC_ROOT": str(static_root),
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "GPUBOOK_VAR_DIR": str(var_dir),
        "GPUBOOK_TELEMETRY_LOCAL": "false",
        "LOG_LEVEL": "WARNING",
    }
    env.pop("GPUBOOK_REQUIRE_POSTGRES", None)
    env.update(extra)
    return env


def collectstatic(env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--no-input", "-v0"], cwd=ROOT, env=env,
                   check=True, timeout=180)


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _start(name: str, argv: list[str], env: dict[str, str], logs: Path, **kwargs) -> Process:
    log = logs / f"{name}.log"
    with open(log, "w") as out:
        popen = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, **kwargs)
    return Process(name, popen, log)


def stop(processes: list[Process]) -> None:
    for process in processes:
        # gunicorn: SIGQUIT is its quick shutdown (SIGTERM waits out keep-alive connections).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.popen.pid, signal.SIGQUIT if process.name == "gunicorn" else signal.SIGTERM)
    for process in processes:
        try:
            process.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.popen.pid, signal.SIGKILL)
            process.popen.wait(timeout=5)


def listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def start_gunicorn(env: dict[str, str], logs: Path, sock: socket.socket, *, workers: int = 2, threads: int = 4,
                   access_log: bool = True) -> Process:
    fd = sock.fileno()
    process = _start(
        "gunicorn",
        [sys.executable, "-m", "gunicorn", "config.wsgi", "--bind", f"fd://{fd}", "--worker-class", "gthread",
         "--workers", str(workers), "--threads", str(threads), *(["--access-logfile", "-"] if access_log else []),
         "--log-level", "warning"],
        env, logs, pass_fds=(fd,),
    )
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/healthz"
    deadline = time.monotonic() + 60
    while True:
        assert process.popen.poll() is None, process.text()
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 — loopback
                if response.status == 200:
                    return process
        except OSError:
            pass
        assert time.monotonic() < deadline, "gunicorn did not answer /healthz:\n" + process.text()
        time.sleep(0.2)


def start_celery(env: dict[str, str], logs: Path) -> list[Process]:
    celery = [sys.executable, "-m", "celery", "-A", "config"]
    worker = _start("worker", [*celery, "worker", "--pool=solo", "--concurrency=1", "-l", "info",
                               "--without-gossip", "--without-mingle", "--without-heartbeat"], env, logs)
    beat = _start("beat", [*celery, "beat", "-l", "info", "-s", str(logs / "beat-schedule")], env, logs)
    deadline = time.monotonic() + 60
    while "ready." not in worker.text():
        assert worker.popen.poll() is None, worker.text()
        assert time.monotonic() < deadline, "celery worker did not become ready:\n" + worker.text()
        time.sleep(0.1)
    return [worker, beat]


@contextlib.contextmanager
def production_stack(env: dict[str, str], logs: Path, *, celery: bool = True) -> Iterator[str]:
    """Yields the server's base URL while gunicorn (and Celery) run."""
    sock = listening_socket()
    origin = f"http://127.0.0.1:{sock.getsockname()[1]}"
    env = {**env, "CSRF_TRUSTED_ORIGINS": origin, "GPUBOOK_BASE_URL": origin}
    processes: list[Process] = []
    try:
        processes.append(start_gunicorn(env, logs, sock))
        sock.close()  # gunicorn holds its own copy
        if celery:
            processes += start_celery(env, logs)
        yield origin
    finally:
        sock.close()
        stop(processes)
