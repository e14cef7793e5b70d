"""Reading a job trace: CSV `job_id,user,group,submit_time,duration_s,num_gpus,status` (the
schema of `../shared/traces/`), optionally only the jobs submitted in a window."""

from __future__ import annotations

import argparse
import csv
import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: int
    user: str
    group: str
    submit_s: float
    duration_s: float
    gpus: int
    status: str


def parse_duration(text: str) -> float:
    """Seconds, with an optional s/m/h/d suffix: `90`, `15m`, `30d`."""
    text = text.strip()
    multipliers = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
    if text and text[-1] in multipliers:
        return float(text[:-1]) * multipliers[text[-1]]
    return float(text)


def parse_window(text: str | None) -> tuple[float, float]:
    """`START:END` in trace seconds (suffix s/m/h/d allowed); either side may be empty."""
    if not text:
        return (-math.inf, math.inf)
    start_text, separator, end_text = text.partition(":")
    if not separator:
        raise argparse.ArgumentTypeError("--window must look like START:END, e.g. 20d:30d")
    start = parse_duration(start_text) if start_text.strip() else -math.inf
    end = parse_duration(end_text) if end_text.strip() else math.inf
    if end <= start:
        raise argparse.ArgumentTypeError("--window END must be after START")
    return (start, end)


def read_trace(path: Path, window: tuple[float, float]) -> list[TraceJob]:
    jobs = []
    seen: set[int] = set()
    with path.open(newline="") as handle:
        for row_number, row in enumerate(csv.DictReader(handle), start=1):
            submit_s = float(row["submit_time"])
            if not (window[0] <= submit_s < window[1]):
                continue
            # Integer ids are kept; others (ITP's UUIDs) become the row's number in the file.
            job_id = int(row["job_id"]) if row["job_id"].isdigit() else row_number
            if job_id in seen:
                raise ValueError(f"{path}: job_id {job_id} appears twice")
            seen.add(job_id)
            jobs.append(
                TraceJob(
                    job_id=job_id,
                    user=row["user"] or f"job-{job_id}",
                    group=row["group"],
                    submit_s=submit_s,
                    duration_s=float(row["duration_s"]),
                    gpus=int(row["num_gpus"]),
                    status=row["status"],
                )
            )
    jobs.sort(key=lambda job: (job.submit_s, job.job_id))
    return jobs
