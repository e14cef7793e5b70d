"""Slot-edge lateness through the Kubernetes path: the embedded scheduler loop (reconcile with
its wake-up at the plan's next slot edge), the Kubernetes executor with the real `kubernetes`
client, and the wire-level fake API server whose fake kubelet runs each Job's container (a
stand-in trainer that logs when it started and when SIGTERM came, then exits 75).
PostgreSQL; N one-GPU reservations starting one second apart.

    .venv/bin/python benchmarks/k8s_lateness.py [--slots 24] [--executor local]

`--executor local` runs the same loop and stand-in with the local executor instead, as the
baseline measured on the same machine at the same time (no API server: only the process
figures).

Start lateness = the Job's create request at the API server − slot start (and, after it, the
container's process running). Stop lateness = the stop's first request (the suspend patch,
followed by the pod delete with the grace) − (end − grace), and SIGTERM in the container −
(end − grace). Baseline: a tick-only scheduler (no wake-up at the edge) is half a tick late on
average and a whole tick at worst.
"""

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _support import ROOT, django_on, fresh_database, percentile

DATABASE = "gpubook_bench_k8s"
TICK_S, GRACE_S, SLOT_S = 5, 3, 8
SLOT_RECORDER = str(ROOT / "tests" / "fakes" / "slot_recorder.py")
NS = "gpubook-bench"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", type=int, default=24)
    parser.add_argument("--executor", choices=("kubernetes", "local"), default="kubernetes")
    args = parser.parse_args(argv)
    url = fresh_database(DATABASE)
    workdir = Path(tempfile.mkdtemp(prefix="gpubook-k8s-slots-"))
    runs_dir = workdir / "runs"
    django_on(url, GPUBOOK_VAR_DIR=str(workdir / "var"), GPUBOOK_RUNS_DIR=str(runs_dir), DEBUG="false",
              GPUBOOK_TICK_SECONDS=str(TICK_S), GPUBOOK_STOP_GRACE_SECONDS=str(GRACE_S), EXECUTOR=args.executor,
              GPUBOOK_DATA_ROOTS=str(workdir / "data" / "{team}"))
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from gpus.models import Gpu, Node
    from reservations.models import Membership, Reservation, ReservationGpu, Team
    from tests.fakes.k8s_api import FakeKubelet, FakeKubernetes
    from training.execution import kubernetes_config_from_settings
    from training.executors.kubernetes import KubernetesExecutor
    from training.loop import scheduler_tick
    from training.models import Run
    from training.services import job_submit

    node = Node.objects.create(name="bench-node")
    team = Team.objects.create(name="bench", slug="bench", monthly_gpu_hours=10_000)
    user = get_user_model().objects.create_user(username="bench")
    Membership.objects.create(team=team, user=user)
    (runs_dir / "bench").mkdir(parents=True)
    kubelet = FakeKubelet(workdir / "kubelet", volumes={"gpubook-runs": runs_dir, "gpubook-data": workdir / "data"})
    fake = FakeKubernetes(kubelet=kubelet).start()
    if args.executor == "kubernetes":
        executor = KubernetesExecutor(
            kubernetes_config_from_settings(), client_configuration=fake.client_configuration()
        )
    else:
        from training.executors.local import LocalConfig, LocalExecutor

        executor = LocalExecutor(LocalConfig(state_dir=workdir / "executor"))
    # A running scheduler has long imported the client's API modules (seconds of pydantic model
    # building, once per process); that start-up is not slot-edge lateness.
    executor.observe(teams=["bench"])
    scheduler_tick(now=timezone.now(), executor=executor)
    first = int(time.time()) + 8
    slots = {}
    for number in range(args.slots):
        gpu = Gpu.objects.create(node=node, index=number, model_name="bench", memory_mib=1)
        start = dt.datetime.fromtimestamp(first + number, tz=dt.UTC)
        end = start + dt.timedelta(seconds=SLOT_S)
        reservation = Reservation.objects.create(user=user, team=team, node=node, gpu_count=1, start=start,
                                                 end=end, created_at=start, updated_at=start)
        ReservationGpu.objects.create(reservation=reservation, gpu=gpu, start=start, end=end)
        events = runs_dir / "bench" / f"slot-{number}.jsonl"
        job_submit(user=user, now=start - dt.timedelta(seconds=10), reservation_id=reservation.pk,
                   document={"task_name": f"slot {number}", "image": "yolo:v8n-cu118", "team": "bench",
                             "command": [sys.executable, SLOT_RECORDER, str(events)]})
        slots[reservation.pk] = (start, end, events)

    # The embedded scheduler loop (manage.py scheduler), with this executor.
    deadline = time.monotonic() + (first + args.slots + SLOT_S + 30 - time.time())
    due, ticks, durations = None, 0, []
    try:
        while time.monotonic() < deadline:
            began = time.monotonic()
            report = scheduler_tick(now=timezone.now(), executor=executor, due=due)
            durations.append(time.monotonic() - began)
            ticks += 1
            if Run.objects.count() == args.slots and not Run.objects.filter(state__in=Run.LIVE).exists():
                break
            wait, due = float(TICK_S), None
            if report.next_wakeup is not None:
                until = (report.next_wakeup - timezone.now()).total_seconds()
                if until < wait:
                    wait, due = max(0.0, until), report.next_wakeup
            time.sleep(wait)
    finally:
        fake.stop()

    jobs_path = rf"^/apis/batch/v1/namespaces/{NS}/jobs"
    creates = {request.body["metadata"]["name"]: request.at for request in fake.requests_for("POST", jobs_path + "$")}
    suspends = {}
    for request in fake.requests_for("PATCH", jobs_path + "/"):
        suspends.setdefault(request.path.rsplit("/", 1)[-1], request.at)
    deletes = {}
    for request in fake.requests_for("DELETE", rf"^/api/v1/namespaces/{NS}/pods/"):
        if request.query.get("gracePeriodSeconds") == str(GRACE_S):
            deletes.setdefault(request.path.rsplit("/", 1)[-1].rsplit("-", 1)[0], request.at)
    figures = {"created": [], "running": [], "stop_issued": [], "pod_delete": [], "sigterm": []}
    missing = 0
    for run in Run.objects.all():
        start, end, events = slots[run.reservation_id]
        name = f"gpubook-run-{run.pk}"
        seen = {}
        if events.exists():
            seen = {line["event"]: line["t"] for line in map(json.loads, events.read_text().splitlines())}
        on_wire = args.executor == "local" or (name in creates and name in suspends)
        if not on_wire or "started" not in seen or "sigterm" not in seen:
            missing += 1
            continue
        stop_due = end.timestamp() - GRACE_S
        figures["running"].append(seen["started"] - start.timestamp())
        figures["sigterm"].append(seen["sigterm"] - stop_due)
        if args.executor == "local":
            continue
        figures["created"].append(creates[name] - start.timestamp())
        figures["stop_issued"].append(suspends[name] - stop_due)
        if name in deletes:
            figures["pod_delete"].append(deletes[name] - stop_due)
    missing += args.slots - Run.objects.count()
    print(f"{args.executor} executor, slot lateness over {len(figures['running'])} slots (missing {missing}); "
          f"{ticks} ticks, tick {TICK_S} s with wake-ups at slot edges, grace {GRACE_S} s")
    labels = {
        "created": "start: Job create request − slot start",
        "running": "start: container process running − slot start",
        "stop_issued": "stop: suspend request − (end − grace)",
        "pod_delete": "stop: pod delete (grace) request − (end − grace)",
        "sigterm": "stop: SIGTERM in the container − (end − grace)",
    }
    for key, label in labels.items():
        values = figures[key]
        if values:
            print(f"  {label}: p50 {1000 * percentile(values, 0.5):.0f} ms, p99 {1000 * percentile(values, 0.99):.0f}"
                  f" ms, max {1000 * max(values):.0f} ms (n={len(values)})")
    print(f"  baseline (tick only, no wake-up): mean {1000 * TICK_S / 2:.0f} ms, worst {1000 * TICK_S:.0f} ms; "
          f"ratio p99(start)/worst {percentile(figures['created'] or figures['running'], 0.99) / TICK_S:.2f}")
    print(f"  tick duration: p50 {1000 * percentile(durations, 0.5):.0f} ms, "
          f"p99 {1000 * percentile(durations, 0.99):.0f} ms ({len(fake.requests)} API requests in all)")
    edges = ("created", "stop_issued") if args.executor == "kubernetes" else ("running", "sigterm")
    ok = missing == 0 and max(percentile(figures[key], 0.99) for key in edges) <= 1.0
    return 0 if ok else 1


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
