"""Booking throughput: N clients book through the real HTTP API (gunicorn + PostgreSQL), and
the same attempts run as raw SQL inserts against the same table and exclusion constraint.

    .venv/bin/python benchmarks/booking.py [--clients 16] [--attempts-per-client 150]

Prints attempts/s, p50/p99 latency for both (the API's after a warm-up, whose first-request
latencies are printed apart: see `api_run`), the API/raw ratio, and checks that neither run
left a double booking. First, in this process (no server, one client): CPU milliseconds and
SQL statements per booking through the same API view stack (`--profile-only` stops there).
Uses its own database (gpubook_bench_booking), dropped and recreated.
"""

import argparse
import datetime as dt
import http.client
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from _support import ROOT, SERVER, django_on, fresh_database, percentile

DATABASE = "gpubook_bench_booking"
DATABASE_URL = f"{SERVER}/{DATABASE}"
NODES, GPUS_PER_NODE, SLOTS, TEAMS = 4, 8, 400, 8
FIRST_SLOT = dt.datetime(2031, 1, 6, tzinfo=dt.UTC)
WARMUP_HOURS_FROM = 1000  # the API run's warm-up books past the workload and the in-process profile


def seed(clients: int) -> tuple[list[int], list[tuple[int, int, str]]]:
    """GPUs, teams and one user + token per client. Returns (gpu ids, [(user, team, token)])."""
    django_on(DATABASE_URL)
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from accounts.services import api_token_issue
    from gpus.models import Gpu, Node
    from reservations.models import Membership, Team

    gpu_ids = []
    for node_number in range(NODES):
        node = Node.objects.create(name=f"bench-{node_number}")
        gpu_ids += [
            Gpu.objects.create(node=node, index=i, model_name="A100", memory_mib=81920).pk for i in range(GPUS_PER_NODE)
        ]
    teams = [Team.objects.create(name=f"t{i}", slug=f"t{i}", monthly_gpu_hours=10**6, max_days_ahead=3650)
             for i in range(TEAMS)]
    people = []
    for number in range(clients):
        user = get_user_model().objects.create_user(username=f"client{number}", email=f"client{number}@lab.example")
        team = teams[number % TEAMS]
        Membership.objects.create(user=user, team=team)
        people.append((user.pk, team.pk, api_token_issue(user=user, now=timezone.now())[1]))
    from django.db import connections

    connections.close_all()
    return gpu_ids, people


def workload(gpu_ids: list[int], clients: int, attempts: int, seed: int = 7) -> list[list[tuple[int, int]]]:
    chooser = random.Random(seed)
    return [[(chooser.choice(gpu_ids), chooser.randrange(SLOTS)) for _ in range(attempts)] for _ in range(clients)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(port: int, *, workers: int, threads: int) -> subprocess.Popen:
    ready = Path(tempfile.mkdtemp(prefix="gpubook-bench-ready-"))
    env = {**os.environ, "DATABASE_URL": DATABASE_URL, "SECRET_KEY": "bench", "DEBUG": "false",
           "ALLOWED_HOSTS": "127.0.0.1", "LOG_LEVEL": "ERROR", "GPUBOOK_BENCH_READY_DIR": str(ready)}
    server = subprocess.Popen(
        [str(ROOT / ".venv/bin/gunicorn"), "config.wsgi", "-b", f"127.0.0.1:{port}", "-k", "gthread",
         "-w", str(workers), "--threads", str(threads), "--log-level", "warning",
         "-c", str(ROOT / "benchmarks/_gunicorn_ready.py")],
        cwd=ROOT, env=env,
    )
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and server.poll() is None:
            forked = set(server_pids(server)[0])  # every worker forked and booted (their CPU is measured)
            if len(forked) == workers and forked <= {int(name.name) for name in ready.iterdir()}:
                return server
            time.sleep(0.1)
    finally:
        shutil.rmtree(ready)
    server.kill()
    raise RuntimeError("gunicorn did not start")


def cpu_seconds(pids) -> float:
    """User + system CPU seconds the processes have used so far (Linux /proc)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # gone meanwhile
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat(5))
    return total / os.sysconf("SC_CLK_TCK")


def server_pids(server: subprocess.Popen) -> tuple[list[int], list[int]]:
    """The gunicorn workers, and the PostgreSQL backends serving this database."""
    with open(f"/proc/{server.pid}/task/{server.pid}/children") as children:
        workers = [int(pid) for pid in children.read().split()]
    with psycopg.connect(DATABASE_URL) as connection:
        backends = [pid for (pid,) in connection.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (DATABASE,)
        )]
    return workers, backends


def run_clients(worker, plans) -> tuple[float, list[float], dict[str, int]]:
    latencies: list[list[float]] = [[] for _ in plans]
    outcomes: list[dict[str, int]] = [{} for _ in plans]
    start_line = threading.Barrier(len(plans) + 1)
    threads = [
        threading.Thread(target=worker, args=(number, plan, start_line, latencies[number], outcomes[number]))
        for number, plan in enumerate(plans)
    ]
    for thread in threads:
        thread.start()
    start_line.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    merged: dict[str, int] = {}
    for outcome in outcomes:
        for key, value in outcome.items():
            merged[key] = merged.get(key, 0) + value
    return elapsed, [value for values in latencies for value in values], merged


def api_run(port: int, people, plans, *, warmup: int):
    """The API run. Before the clock starts, each client books ``warmup`` free slots past the
    workload's (not counted in the rate): the first requests a freshly booted worker serves
    open its threads' database connections and build its prepared reads, which a server that
    has been up a while did long ago. Their latencies come back apart, to be shown apart."""
    first: list[float] = []

    def worker(number, plan, start_line, latencies, outcomes):
        _, team_id, token = people[number]
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}

        def attempt(gpu_id: int, start: dt.datetime) -> tuple[float, int, bytes]:
            body = json.dumps({"gpus": [gpu_id], "team": team_id, "start": start.isoformat(),
                               "end": (start + dt.timedelta(hours=1)).isoformat()})
            began = time.perf_counter()
            connection.request("POST", "/api/v1/reservations/", body=body, headers=headers)
            response = connection.getresponse()
            payload = response.read()
            return time.perf_counter() - began, response.status, payload

        for number_in_warmup in range(warmup):
            hour = SLOTS + WARMUP_HOURS_FROM + number * warmup + number_in_warmup
            latency, status, payload = attempt(plan[0][0], FIRST_SLOT + dt.timedelta(hours=hour))
            if status != 201:
                raise RuntimeError(f"warm-up booking refused: {status} {payload[:200]!r}")
            first.append(latency)
        start_line.wait()
        for gpu_id, slot in plan:
            latency, status, payload = attempt(gpu_id, FIRST_SLOT + dt.timedelta(hours=slot))
            latencies.append(latency)
            key = str(status) if status in (201, 409) else f"{status}:{payload[:80]!r}"
            outcomes[key] = outcomes.get(key, 0) + 1
        connection.close()

    return (*run_clients(worker, plans), first)


def raw_run(people, plans, *, gpu_lock: bool):
    """Plain SQL inserts. `gpu_lock=False`: the constraint alone; True: each insert first
    takes the same per-GPU advisory lock the service takes (the lower bound of our recipe)."""

    def worker(number, plan, start_line, latencies, outcomes):
        user_id, team_id, _ = people[number]
        # autocommit: each `transaction()` below is then a real transaction, not a savepoint
        # inside one that never ends (which would hold every lock to the end of the run).
        connection = psycopg.connect(DATABASE_URL, autocommit=True)
        node_of = dict(connection.execute("SELECT id, node_id FROM gpus_gpu").fetchall())
        start_line.wait()
        for gpu_id, slot in plan:
            start = FIRST_SLOT + dt.timedelta(hours=slot)
            end = start + dt.timedelta(hours=1)
            began = time.perf_counter()
            try:
                with connection.transaction():
                    if gpu_lock:
                        connection.execute("SELECT pg_advisory_xact_lock(7100001, %s)", (gpu_id,))
                    (reservation_id,) = connection.execute(
                        "INSERT INTO reservations_reservation (user_id, team_id, node_id, gpu_count, start, \"end\","
                        " status, note, release_reason, created_at, updated_at)"
                        " VALUES (%s, %s, %s, 1, %s, %s, 'confirmed', '', '', now(), now()) RETURNING id",
                        (user_id, team_id, node_of[gpu_id], start, end),
                    ).fetchone()
                    connection.execute(
                        "INSERT INTO reservations_reservationgpu (reservation_id, gpu_id, start, \"end\", occupies)"
                        " VALUES (%s, %s, %s, %s, true)",
                        (reservation_id, gpu_id, start, end),
                    )
                key = "201"
            except psycopg.errors.ExclusionViolation:
                key = "409"
            except psycopg.errors.DeadlockDetected:
                # The constraint alone lets two inserts wait on each other's index check;
                # PostgreSQL breaks the tie after deadlock_timeout (1 s) and fails one of them.
                key = "40P01"
            latencies.append(time.perf_counter() - began)
            outcomes[key] = outcomes.get(key, 0) + 1
        connection.close()

    return run_clients(worker, plans)


def double_bookings() -> int:
    with psycopg.connect(DATABASE_URL) as connection:
        (count,) = connection.execute(
            "SELECT count(*) FROM reservations_reservationgpu a JOIN reservations_reservationgpu b"
            " ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.occupies AND b.occupies"
            " AND a.start < b.\"end\" AND b.start < a.\"end\""
        ).fetchone()
    return count


def clear_bookings() -> None:
    with psycopg.connect(DATABASE_URL) as connection:
        connection.execute(
            "TRUNCATE reservations_auditentry, reservations_reservationgpu, reservations_reservation CASCADE"
        )


def profile_in_process(people, gpu_ids, bookings: int = 200) -> tuple[float, float]:
    """One client books `bookings` free slots through the whole Django stack in this process
    (middleware, token auth, DRF, the service, the response): CPU ms per booking (this
    process only, so the database's own CPU is not in it) and statements per booking."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    _, team_id, token = people[0]
    client = Client(HTTP_AUTHORIZATION=f"Token {token}", HTTP_HOST="127.0.0.1")

    def book(number: int) -> None:
        start = FIRST_SLOT + dt.timedelta(hours=SLOTS + number)  # past the workload's slots: always free
        response = client.post(
            "/api/v1/reservations/",
            {"gpus": [gpu_ids[number % len(gpu_ids)]], "team": team_id, "start": start.isoformat(),
             "end": (start + dt.timedelta(hours=1)).isoformat()},
            content_type="application/json",
        )
        if response.status_code != 201:
            raise RuntimeError(f"profile booking refused: {response.status_code} {response.content[:200]!r}")

    for number in range(20):  # warm: imports, URL resolver, first connection
        book(number)
    began = time.process_time()
    for number in range(20, 20 + bookings):
        book(number)
    cpu_ms = 1000 * (time.process_time() - began) / bookings
    with CaptureQueriesContext(connection) as captured:
        for number in range(20 + bookings, 40 + bookings):
            book(number)
    statements = len(captured.captured_queries) / 20
    print(f"in-process: {cpu_ms:.1f} ms CPU and {statements:.1f} SQL statements per booking "
          f"(one client, {bookings} bookings; goal <= 8 ms and <= 12)")
    if os.environ.get("BENCH_SHOW_SQL"):
        for query in captured.captured_queries[-int(statements):]:
            print("   ", query["sql"][:160])
    connection.close()
    return cpu_ms, statements


def report(name: str, elapsed: float, latencies: list[float], outcomes: dict[str, int]) -> float:
    rate = len(latencies) / elapsed
    print(f"{name:>8}: {len(latencies)} attempts in {elapsed:.2f} s = {rate:,.0f} attempts/s; "
          f"p50 {1000 * statistics.median(latencies):.1f} ms, p99 {1000 * percentile(latencies, 0.99):.1f} ms; "
          f"outcomes {dict(sorted(outcomes.items()))}")
    return rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--attempts-per-client", type=int, default=150)
    parser.add_argument("--profile-only", action="store_true", help="only the in-process CPU/statements figure")
    # The production line README.md recommends (and deploy/compose.yaml runs): 4 workers x 8 threads.
    parser.add_argument("--workers", type=int, default=4, help="gunicorn workers")
    parser.add_argument("--threads", type=int, default=8, help="gunicorn threads per worker")
    parser.add_argument("--warmup", type=int, default=10,
                        help="bookings per client before the API run's clock starts (reported apart)")
    args = parser.parse_args(argv)

    fresh_database(DATABASE)
    gpu_ids, people = seed(args.clients)
    plans = workload(gpu_ids, args.clients, args.attempts_per_client)
    print(f"booking benchmark: {args.clients} clients x {args.attempts_per_client} attempts, "
          f"{len(gpu_ids)} GPUs x {SLOTS} one-hour slots, {TEAMS} teams; gunicorn {args.workers} workers x "
          f"{args.threads} threads on {os.cpu_count()} CPUs")
    profile_in_process(people, gpu_ids)
    clear_bookings()
    if args.profile_only:
        return 0

    raw_rate = report("raw", *raw_run(people, plans, gpu_lock=False))
    raw_doubles = double_bookings()
    clear_bookings()
    locked_rate = report("raw+lock", *raw_run(people, plans, gpu_lock=True))
    raw_doubles += double_bookings()
    clear_bookings()

    port = free_port()
    server = start_server(port, workers=args.workers, threads=args.threads)
    try:
        workers, _ = server_pids(server)
        workers_before = cpu_seconds(workers)
        elapsed, latencies, outcomes, first = api_run(port, people, plans, warmup=args.warmup)
        if first:
            print(f"  warm-up: the first {args.warmup} bookings of each client after the workers booted: "
                  f"p50 {1000 * statistics.median(first):.1f} ms, p99 {1000 * percentile(first, 0.99):.1f} ms, "
                  f"max {1000 * max(first):.1f} ms (not in the figures below)")
        api_rate = report("api", elapsed, latencies, outcomes)
        # The backends were opened by this run (the workers connect on their first request),
        # so all their CPU is the run's.
        _, backends = server_pids(server)
        per_attempt = 1000 / len(latencies)
        print(f"server CPU per attempt under load: gunicorn {per_attempt * (cpu_seconds(workers) - workers_before):.1f}"
              f" ms, PostgreSQL {per_attempt * cpu_seconds(backends):.1f} ms")
    finally:
        server.terminate()
        server.wait(timeout=30)
    api_doubles = double_bookings()

    print(f"API/raw throughput ratio: {api_rate / raw_rate:.3f} (goal >= 0.06); "
          f"API/(raw + advisory lock): {api_rate / locked_rate:.3f}; API p99 goal <= 200 ms; "
          f"load average while measuring: {os.getloadavg()[0]:.1f}")
    print(f"double bookings: raw {raw_doubles}, api {api_doubles}")
    if raw_doubles or api_doubles:
        print("FAIL: a GPU was double-booked", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
