"""A gunicorn worker's memory over 10,000 mixed requests (issue #19 item 4).

    .venv/bin/python benchmarks/memory.py [--requests 10000]

One gunicorn worker (gthread, one thread; the production settings of tests/e2e/production.py:
DEBUG=false, hashed static files) on PostgreSQL, driven by one client over keep-alive with a
fixed mix through the API: list GPUs, teams and reservations, GPU availability, book a slot,
read the booking back, cancel it, a 404, a refused booking (400) and /healthz. Prints the
worker's resident set size (VmRSS) after the first 100 requests — the baseline, measured in the
same run — and after every 2,000, and the ratio at the end (goal <= 1.2x: no growth).
Uses its own database (gpubook_bench_memory), dropped and recreated.
"""

import argparse
import datetime as dt
import http.client
import json
import sys
import tempfile
from pathlib import Path

from _support import ROOT, SERVER, django_on, fresh_database

sys.path.insert(0, str(ROOT))
from tests.e2e.production import collectstatic, listening_socket, production_env, start_gunicorn, stop

DATABASE = "gpubook_bench_memory"
FIRST_SLOT = dt.datetime(2031, 1, 6, tzinfo=dt.UTC)


def seed() -> tuple[str, int, list[int]]:
    """GPUs, a team, a member with an API token. Returns (token, team id, GPU ids)."""
    django_on(f"{SERVER}/{DATABASE}")
    from django.contrib.auth import get_user_model
    from django.db import connections
    from django.utils import timezone

    from accounts.services import api_token_issue
    from gpus.models import Gpu, Node
    from reservations.models import Membership, Team

    node = Node.objects.create(name="mem-node")
    gpu_ids = [Gpu.objects.create(node=node, index=i, model_name="A100", memory_mib=81920).pk for i in range(8)]
    team = Team.objects.create(name="memory", slug="memory", monthly_gpu_hours=10**7, max_days_ahead=3650)
    user = get_user_model().objects.create_user(username="client", email="client@lab.example")
    Membership.objects.create(user=user, team=team)
    token = api_token_issue(user=user, now=timezone.now())[1]
    connections.close_all()
    return token, team.pk, gpu_ids


def worker_pid(master: int) -> int:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    if len(children) != 1:
        raise RuntimeError(f"expected one gunicorn worker, found {children}")
    return int(children[0])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def drive(port: int, token: str, team_id: int, gpu_ids: list[int], count: int, on_progress) -> dict[int, int]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    statuses: dict[int, int] = {}
    state = {"booked": None, "slot": 0}

    def request(method: str, path: str, body: dict | None = None) -> dict | None:
        connection.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        response = connection.getresponse()
        payload = response.read()
        statuses[response.status] = statuses.get(response.status, 0) + 1
        return json.loads(payload) if response.status in (200, 201) and payload.startswith(b"{") else None

    def book() -> None:
        state["slot"] += 1
        start = FIRST_SLOT + dt.timedelta(hours=state["slot"] // len(gpu_ids))
        created = request("POST", "/api/v1/reservations/", {
            "gpus": [gpu_ids[state["slot"] % len(gpu_ids)]], "team": team_id,
            "start": start.isoformat(), "end": (start + dt.timedelta(hours=1)).isoformat()})
        state["booked"] = created["id"] if created else None

    day = FIRST_SLOT.date().isoformat()
    mix = [
        lambda: request("GET", "/api/v1/gpus/"),
        lambda: request("GET", "/api/v1/teams/"),
        lambda: request("GET", "/api/v1/reservations/?limit=50"),
        lambda: request("GET", f"/api/v1/gpus/{gpu_ids[0]}/availability/?from={day}T00:00:00Z&to={day}T23:00:00Z"),
        book,
        lambda: request("GET", f"/api/v1/reservations/{state['booked']}/"),
        lambda: request("POST", f"/api/v1/reservations/{state['booked']}/cancel/", {"reason": "benchmark"}),
        lambda: request("GET", "/api/v1/reservations/999999999/"),
        lambda: request("POST", "/api/v1/reservations/", {"gpus": [], "team": team_id, "start": "nope"}),
        lambda: request("GET", "/healthz"),
    ]
    for number in range(1, count + 1):
        mix[(number - 1) % len(mix)]()
        on_progress(number)
    connection.close()
    return statuses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10_000)
    args = parser.parse_args(argv)
    if args.requests < 100:
        parser.error("--requests must be at least 100: the baseline is taken after 100")
    url = fresh_database(DATABASE)
    token, team_id, gpu_ids = seed()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        env = production_env(database_url=url, redis_url="", var_dir=tmp_path / "var", static_root=tmp_path / "static",
                             API_RATE_LIMIT="1000000/hour",
                             SECRET_KEY="bench", SECRET_KEY_MIN_LENGTH="1")  # the key the token was issued under
        collectstatic(env)
        sock = listening_socket()
        server = start_gunicorn(env, tmp_path, sock, workers=1, threads=1, access_log=False)
        try:
            pid = worker_pid(server.popen.pid)
            marks: dict[int, int] = {}

            def on_progress(number: int) -> None:
                if number == 100 or number % 2000 == 0 or number == args.requests:
                    marks[number] = rss_kib(pid)
                    print(f"  after {number:>6,} requests: worker RSS {marks[number] / 1024:.1f} MiB", flush=True)

            statuses = drive(sock.getsockname()[1], token, team_id, gpu_ids, args.requests, on_progress)
        finally:
            stop([server])
            sock.close()
    ratio = marks[args.requests] / marks[100]
    print(f"responses by status: {dict(sorted(statuses.items()))}")
    verdict = "met" if ratio <= 1.2 else "NOT met"
    print(f"RSS after {args.requests:,} / after 100 = {ratio:.3f} (goal <= 1.2: {verdict})")
    return 0 if ratio <= 1.2 else 1


if __name__ == "__main__":
    sys.exit(main())
