"""Progress events: one JSON line on stdout per event, the same body POSTed to the web app.

Every event has exactly this shape (on stdout, in ``output_dir/events.jsonl``, and as the
body of ``POST report_url`` with ``Authorization: Bearer <report_token>`` and
``Content-Type: application/json``)::

    {
      "run_id":  "42",                     # the spec's run_id (always a string)
      "event":   "epoch",                  # see below
      "epoch":   3,                        # see below (int, >= 0)
      "epochs":  30,                       # total epochs of the training
      "metrics": {"mAP50": 0.41, ...},     # name -> number (int or float), never nested
      "time":    "2026-11-29T17:02:03.123Z",  # UTC, when the event happened
      "detail":  {...}                     # anything that is not a number (may be {})
    }

Events, in order:

``started``     epoch = epochs already done (0 for a fresh run); metrics: ``batches`` (per
                epoch), ``start_epoch``; detail: ``resumed_from`` (path or null), ``save_dir``,
                ``model``, ``device``.
``batch``       epoch = the 1-based epoch in progress; metrics: ``batch`` (1-based), ``batches``,
                the running mean train losses (``box_loss``, ``cls_loss``, ``dfl_loss``; other
                tasks add e.g. ``seg_loss``), ``lr``, ``elapsed_s``, ``eta_s``. Emitted for the
                first batch of each epoch and then at most once a second on stdout; POSTed at
                most once every 10 s.
``epoch``       epoch = the 1-based epoch just finished (its checkpoint is written); metrics:
                the train losses, ``precision``, ``recall``, ``mAP50``, ``mAP50-95``,
                ``val_box_loss``..., ``fitness``, ``lr``, ``epoch_time_s``, ``elapsed_s``, ``eta_s``.
``final``       the validation of best.pt after the last epoch (epoch = epochs); metrics as
                ``epoch`` without the losses.
``export``      detail: ``format``, ``ok`` (bool), ``path`` or ``error``.
``artifacts``   detail: ``manifest`` (path) and ``artifacts`` (the manifest's list).
``warning``     detail: ``message``.
``succeeded`` / ``checkpointed`` / ``failed``: the last event; detail is the termination
                message (see ``training/runner/termination.py``); epoch = epochs completed.

Metric names drop Ultralytics' prefixes: ``train/box_loss`` → ``box_loss``,
``val/box_loss`` → ``val_box_loss``, ``metrics/mAP50(B)`` → ``mAP50`` (mask metrics keep
their ``(M)``), ``lr/pg0`` → ``lr``.

A report that fails never stops or slows training: POSTs go through a bounded buffer drained
by one background thread (urllib, 3 s timeout). When the buffer is full the oldest event is
dropped. At exit the buffer gets a short, bounded time to drain.
"""

from __future__ import annotations

import collections
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

REPORT_TIMEOUT_S = 3.0
REPORT_BUFFER = 256
BATCH_STDOUT_EVERY_S = 1.0
BATCH_REPORT_EVERY_S = 10.0


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def metric_name(key: str) -> str:
    """Ultralytics' column name → the report's metric name (see module docstring)."""
    if key.startswith("train/"):
        return key.removeprefix("train/")
    if key.startswith("val/"):
        return "val_" + key.removeprefix("val/")
    if key.startswith("metrics/"):
        return key.removeprefix("metrics/").removesuffix("(B)")
    if key == "lr/pg0":
        return "lr"
    if key.startswith("lr/"):
        return "lr_" + key.removeprefix("lr/")
    return key


def clean_metrics(values: Mapping[str, Any]) -> dict[str, float | int]:
    """Rename and keep only finite numbers (tensors and numpy scalars become floats)."""
    out: dict[str, float | int] = {}
    for key, value in values.items():
        if isinstance(value, bool):
            continue
        if not isinstance(value, int | float):
            try:
                value = float(value)
            except (TypeError, ValueError):
                continue
        if isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                continue
            value = round(value, 6)
        out[metric_name(key)] = value
    return out


class Reporter:
    """POSTs event bodies to ``url`` from a background thread; never raises, never blocks long."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        log: IO[str] | None = None,
        timeout_s: float = REPORT_TIMEOUT_S,
        buffer: int = REPORT_BUFFER,
    ) -> None:
        if not url.lower().startswith(("http://", "https://")):
            raise ValueError(f"report URL must be http(s): {url!r}")
        self._url = url
        self._headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {token}",
            "User-Agent": "gpubook-runner/1",
        }
        self._timeout_s = timeout_s
        self._log = log or sys.stderr
        self._pending: collections.deque[bytes] = collections.deque(maxlen=buffer)
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._drain, name="gpubook-report", daemon=True)
        self._thread.start()

    def submit(self, body: Mapping[str, Any]) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        with self._cond:
            if self._closed:
                return
            if len(self._pending) == self._pending.maxlen:
                self.dropped += 1  # deque(maxlen) drops the oldest on append
            self._pending.append(data)
            self._cond.notify()

    def close(self, timeout_s: float) -> bool:
        """Give the buffer up to ``timeout_s`` to drain; True if everything was attempted."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            while self._pending or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return not self._pending and not self._busy

    def _drain(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                data = self._pending.popleft()
                self._busy = True
            try:
                self._post(data)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _post(self, data: bytes) -> None:
        # The scheme is http(s): checked in __init__.
        request = urllib.request.Request(self._url, data=data, headers=self._headers, method="POST")  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as response:  # noqa: S310
                response.read(1024)
            self.sent += 1
            return
        except urllib.error.HTTPError as exc:
            problem = f"HTTP {exc.code} {exc.reason}"
            if exc.code in (401, 403):
                problem += " (report_token rejected?)"
        except (OSError, ValueError) as exc:  # URLError, timeouts, connection refused
            problem = f"{type(exc).__name__}: {exc}"
        self.failed += 1
        if self.failed == 1 or self.failed % 50 == 0:
            print(
                f"gpubook-runner: progress report failed ({self.failed} so far): {problem}; training continues",
                file=self._log,
                flush=True,
            )


class Events:
    """Writes events to stdout (JSON lines), ``events.jsonl`` and the :class:`Reporter`."""

    def __init__(
        self,
        run_id: str,
        out: IO[str],
        *,
        log_file: Path | None = None,
        reporter: Reporter | None = None,
        clock=time.monotonic,
    ) -> None:
        self.run_id = run_id
        self.epochs = 0
        self._out = out
        self._log_file = log_file.open("a", encoding="utf-8") if log_file else None
        self._reporter = reporter
        self._lock = threading.Lock()
        self._clock = clock
        self._last_batch_out = float("-inf")
        self._last_batch_report = float("-inf")

    def emit(
        self,
        event: str,
        *,
        epoch: int,
        metrics: Mapping[str, Any] | None = None,
        detail: Mapping[str, Any] | None = None,
        epochs: int | None = None,
        report: bool = True,
    ) -> dict[str, Any]:
        body = {
            "run_id": self.run_id,
            "event": event,
            "epoch": int(epoch),
            "epochs": int(self.epochs if epochs is None else epochs),
            "metrics": clean_metrics(metrics or {}),
            "time": utc_now_iso(),
            "detail": dict(detail or {}),
        }
        line = json.dumps(body, separators=(",", ":"), default=str)
        with self._lock:
            for stream in (self._out, self._log_file):
                if stream is None:
                    continue
                try:
                    stream.write(line + "\n")
                    stream.flush()
                except (OSError, ValueError):
                    pass  # a closed stdout (reader gone) or a full disk must not stop training
        if report and self._reporter is not None:
            self._reporter.submit(body)
        return body

    def batch(self, *, epoch: int, first_of_epoch: bool, metrics: Mapping[str, Any]) -> None:
        """A batch event, thinned: stdout at most once a second, reports once every 10 s."""
        now = self._clock()
        to_out = first_of_epoch or now - self._last_batch_out >= BATCH_STDOUT_EVERY_S
        to_report = now - self._last_batch_report >= BATCH_REPORT_EVERY_S
        if not to_out:
            return
        self._last_batch_out = now
        if to_report:
            self._last_batch_report = now
        self.emit("batch", epoch=epoch, metrics=metrics, report=to_report)

    def close(self, report_timeout_s: float) -> None:
        if self._reporter is not None:
            self._reporter.close(report_timeout_s)
        with self._lock:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
