"""Helpers for the runner tests: a loopback report server, a network audit hook, and a
driver for the runner child process that reads its progress events as they come."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
REPORT_TOKEN = "run-token-0123456789"


# --- a web app stand-in: records every report ------------------------------------------------


@dataclass
class ReportServer:
    url: str
    bodies: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # Authorization headers that were wrong
    status: int = 204
    delay_s: float = 0.0

    def events(self) -> list[str]:
        return [body["event"] for body in self.bodies]


@contextlib.contextmanager
def serve_reports() -> Iterator[ReportServer]:
    state = ReportServer(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(length)
            if state.delay_s:
                time.sleep(state.delay_s)
            if self.headers.get("Authorization") != f"Bearer {REPORT_TOKEN}":
                state.rejected.append(self.headers.get("Authorization") or "")
                self.send_response(401)
            else:
                state.bodies.append(json.loads(data))
                self.send_response(state.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/api/runs/report"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


# --- no network: an audit hook in every runner child -------------------------------------------

_SITECUSTOMIZE = textwrap.dedent(
    '''
    """Test-only: record every attempt to reach a non-loopback address (DNS or connect)."""
    import json
    import os
    import sys

    _LOG = os.environ["GPUBOOK_AUDIT_LOG"]
    _LOCAL = ("127.", "::1", "localhost", "0.0.0.0")

    def _local(host):
        if host is None or isinstance(host, (bytes, bytearray)):
            return True
        return str(host).startswith(_LOCAL)

    def _hook(event, args):
        if event == "socket.connect":
            address = args[1]
            if isinstance(address, tuple) and not _local(address[0]):
                _record(event, address[0])
        elif event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr"):
            if not _local(args[0]):
                _record(event, args[0])
        elif event == "urllib.Request":
            from urllib.parse import urlsplit

            if not _local(urlsplit(args[0]).hostname):
                _record(event, args[0])

    def _record(event, target):
        with open(_LOG, "a") as log:
            log.write(json.dumps({"event": event, "target": str(target), "pid": os.getpid()}) + "\\n")

    sys.addaudithook(_hook)
    '''
)


def make_network_audit(tmp_path: Path) -> Path:
    """A directory holding the audit ``sitecustomize``; its log is ``<dir>/network.jsonl``."""
    hook_dir = tmp_path / "audit"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return hook_dir


def network_attempts(audit_dir: Path) -> list[dict[str, Any]]:
    log = audit_dir / "network.jsonl"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line]


# --- the runner child ----------------------------------------------------------------------------


class RunnerProcess:
    """``python -m training.runner`` in its own session, its stdout read line by line."""

    def __init__(
        self,
        spec_path: Path,
        *,
        audit_dir: Path | None = None,
        batch_delay_s: float = 0.0,
        stderr_path: Path | None = None,
    ) -> None:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.lower().endswith("_proxy") and not key.startswith(("YOLO_", "GPUBOOK_"))
        }
        env["PYTHONUNBUFFERED"] = "1"
        if audit_dir is not None:
            env["PYTHONPATH"] = str(audit_dir)
            env["GPUBOOK_AUDIT_LOG"] = str(audit_dir / "network.jsonl")
        if batch_delay_s:
            env["GPUBOOK_RUNNER_BATCH_DELAY_S"] = str(batch_delay_s)
        self.stderr_path = stderr_path or spec_path.with_suffix(".stderr.log")
        self._stderr = self.stderr_path.open("w")
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "training.runner", "--spec", str(spec_path)],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            start_new_session=True,  # its own process group, so a group signal hits only it
        )
        self.events: list[dict[str, Any]] = []
        self.raw_lines: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float) -> dict:
        """Read events until one matches (returned); fail on timeout or early exit."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                pytest.fail(f"no matching event within {timeout} s; got {self._summary()}")
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self._lines.put(None)
                pytest.fail(
                    f"runner exited ({self.process.wait()}) before a matching event; "
                    f"got {self._summary()}\n{self.stderr_tail()}"
                )
            event = self._parse(line)
            if predicate(event):
                return event

    def wait(self, timeout: float) -> int:
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"runner still running after {timeout} s; got {self._summary()}")
        while True:
            line = self._lines.get(timeout=10)
            if line is None:
                break
            self._parse(line)
        self._stderr.close()
        return code

    def signal(self, signum: int = signal.SIGTERM, *, group: bool = False) -> None:
        if group:
            os.killpg(self.process.pid, signum)
        else:
            self.process.send_signal(signum)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stderr_tail(self, chars: int = 3000) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")[-chars:]

    def _parse(self, line: str) -> dict[str, Any]:
        self.raw_lines.append(line)
        event = json.loads(line)  # every stdout line must be JSON
        self.events.append(event)
        return event

    def _summary(self) -> list[tuple[str, int]]:
        return [(event["event"], event["epoch"]) for event in self.events]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.events if event["event"] == kind]


def write_spec(path: Path, **fields: Any) -> Path:
    path.write_text(json.dumps(fields))
    return path
