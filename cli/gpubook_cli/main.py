"""The `gpubook` command. Each command parses its options, makes API calls, and prints a table
(or JSON with --json). Exit codes: 0 ok, 1 the API refused, 2 bad usage, 3 server unreachable."""

import datetime as dt
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpubook_cli import __version__, config, slots
from gpubook_cli.client import ApiError, Client, Unreachable

FINISHED_RUN_STATES = {"succeeded", "failed", "checkpointed", "killed", "timed_out", "cancelled"}
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def client_from_settings() -> Client:
    settings = config.load()
    if not settings.token:
        raise click.ClickException("not logged in: run `gpubook login` (or set GPUBOOK_TOKEN)")
    return Client(settings.url, settings.token)


def api_command(function):
    """Turn API refusals and network failures into one line on stderr and a non-zero exit."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except ApiError as error:
            err.print(f"[red]error:[/red] {error.detail}", markup=True)
            problems = error.body.get("problems", []) if isinstance(error.body, dict) else []
            for problem in problems:
                err.print(f"  - {problem.get('field') or '(spec)'}: {problem.get('problem')}", markup=False)
            sys.exit(1)
        except Unreachable as error:
            err.print(f"error: {error}", markup=False)
            sys.exit(3)

    return wrapper


def json_option(function):
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(function)


def emit(rows: Any, as_json: bool, table: Table | None) -> None:
    if as_json:
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
    elif table is not None:
        out.print(table)


def parse_when(value: str) -> dt.datetime:
    """An ISO-8601 time; without an offset it is read in this machine's local zone (the
    server refuses naive times, so the CLI makes the zone explicit before sending)."""
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO-8601 date-time (e.g. 2026-12-02T09:00+01:00)") from None
    return when if when.tzinfo else when.astimezone()


def ceil_to_slot(when: dt.datetime, minutes: int) -> dt.datetime:
    when = when.astimezone(dt.UTC).replace(second=0, microsecond=0)
    step = minutes * 60
    seconds = int(when.timestamp())
    return dt.datetime.fromtimestamp(-(-seconds // step) * step, dt.UTC)


def local(value: str | None) -> str:
    """A server time (UTC ISO-8601) shown in this machine's zone."""
    if not value:
        return "—"
    return dt.datetime.fromisoformat(value).astimezone().strftime("%Y-%m-%d %H:%M %Z")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpubook", message="%(prog)s %(version)s")
def cli() -> None:
    """Book GPUs and run training jobs on gpubook from the terminal."""


# --- account -------------------------------------------------------------------------------------


@cli.command()
@click.option("--url", help="Server address, e.g. https://gpubook.example.org (default: saved or GPUBOOK_URL).")
@click.option("--username", prompt=True)
@click.option("--password", prompt=True, hide_input=True, help="Prompted for when absent (never echoed).")
@api_command
def login(url: str | None, username: str, password: str) -> None:
    """Exchange a username and password for an API token and save it (mode 0600)."""
    server = (url or config.load().url).rstrip("/")
    client = Client(server, None)
    token = client.post("auth/token/", {"username": username, "password": password})["token"]
    path = config.save(url=server, token=token)
    out.print(f"Logged in to {server} as {username}; token saved in {path}", markup=False)


@cli.command()
def logout() -> None:
    """Forget the saved token."""
    out.print("Token removed." if config.forget() else "No saved token.", markup=False)


# --- GPUs and bookings ----------------------------------------------------------------------------


@cli.command()
@json_option
@api_command
def gpus(as_json: bool) -> None:
    """List the GPU inventory."""
    rows = client_from_settings().get_all("gpus/")
    table = Table("id", "node", "index", "model", "memory", "state")
    for gpu in rows:
        table.add_row(str(gpu["id"]), gpu["node"], str(gpu["index"]), gpu["model_name"],
                      f"{gpu['memory_mib'] // 1024} GiB" if gpu.get("memory_mib") else "—", gpu["state"])
    emit(rows, as_json, table)


@cli.command()
@click.option("--gpus", "gpu_count", type=click.IntRange(1, 64), default=1, show_default=True)
@click.option("--hours", type=click.FloatRange(min=0.5), default=1.0, show_default=True)
@click.option("--from", "from_", help="Earliest start (ISO-8601); default: now.")
@click.option("--days", type=click.IntRange(1, 62), default=14, show_default=True, help="How far ahead to look.")
@click.option("--node", help="Only this node.")
@click.option("--limit", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option("--slot-minutes", type=click.IntRange(1, 1440), default=30, show_default=True,
              help="The server's slot size: starts are rounded up to it.")
@json_option
@api_command
def free(gpu_count, hours, from_, days, node, limit, slot_minutes, as_json) -> None:
    """The next slots where GPUS GPUs of one node are free together for HOURS."""
    client = client_from_settings()
    earliest = ceil_to_slot(parse_when(from_) if from_ else dt.datetime.now(dt.UTC), slot_minutes)
    horizon = earliest + dt.timedelta(days=days)
    inventory = [g for g in client.get_all("gpus/") if g["state"] == "active" and (node is None or g["node"] == node)]
    free_by_gpu = {}
    for gpu in inventory:
        window = {"from": earliest.isoformat(), "to": horizon.isoformat()}
        answer = client.get(f"gpus/{gpu['id']}/availability/", **window)
        free_by_gpu[gpu["id"]] = [
            (dt.datetime.fromisoformat(w["start"]), dt.datetime.fromisoformat(w["end"])) for w in answer["free"]
        ]
    found = slots.next_slots(
        free_by_gpu=free_by_gpu, node_of={g["id"]: g["node"] for g in inventory}, gpus=gpu_count,
        duration=dt.timedelta(hours=hours), earliest=earliest, limit=limit,
    )
    rows = [{"node": s.node, "start": s.start.isoformat(), "end": s.end.isoformat(), "gpus": list(s.gpu_ids)}
            for s in found]
    table = Table("node", "start", "end", "gpu ids", title=f"{gpu_count} GPU(s) for {hours:g} h")
    for slot in rows:
        table.add_row(slot["node"], local(slot["start"]), local(slot["end"]), ",".join(map(str, slot["gpus"])))
    emit(rows, as_json, table)
    if not rows and not as_json:
        err.print(f"No {gpu_count} GPUs of one node are free for {hours:g} h in the next {days} days.", markup=False)


def resolve_team(client: Client, team: str | None) -> int:
    teams = client.get_all("teams/")
    if team is None:
        if len(teams) == 1:
            return teams[0]["id"]
        names = ", ".join(t["slug"] for t in teams) or "none"
        raise click.UsageError(f"say which team with --team (yours: {names})")
    for row in teams:
        if team in {str(row["id"]), row["slug"], row["name"]}:
            return row["id"]
    raise click.UsageError(f"you are in no team {team!r}")


@cli.command()
@click.option("--gpu", "gpu_ids", type=click.IntRange(1), multiple=True, help="A GPU id (repeat for more).")
@click.option("--count", type=click.IntRange(1, 64),
              help="Instead of --gpu: this many GPUs of one node, chosen by the server so that the "
                   "booking's start stops the least running work.")
@click.option("--start", required=True, help="ISO-8601; without an offset, this machine's zone.")
@click.option("--end", help="ISO-8601 end; or give --hours.")
@click.option("--hours", type=click.FloatRange(min=0.5))
@click.option("--team", help="Team slug or id (default: your only team).")
@click.option("--note", default="")
@json_option
@api_command
def book(gpu_ids, count, start, end, hours, team, note, as_json) -> None:
    """Book GPUs of one node for [START, END): the --gpu ids (find them with `gpubook free`),
    or --count GPUs the server chooses."""
    if bool(gpu_ids) == (count is not None):
        raise click.UsageError("give --gpu ids (see `gpubook free`) or --count, one of the two")
    if (end is None) == (hours is None):
        raise click.UsageError("give exactly one of --end or --hours")
    begin = parse_when(start)
    finish = parse_when(end) if end else begin + dt.timedelta(hours=hours)
    client = client_from_settings()
    if count is not None:
        gpu_ids = client.get("booking-placement/", gpus=count, start=begin.isoformat(), end=finish.isoformat())["gpus"]
    booking = client.post("reservations/", {
        "gpus": list(gpu_ids), "start": begin.isoformat(), "end": finish.isoformat(),
        "team": resolve_team(client, team), "note": note,
    })
    if as_json:
        emit(booking, True, None)
    else:
        out.print(f"Booked #{booking['id']} ({booking['status']}): {booking['node']} GPUs "
                  f"{','.join(map(str, booking['gpus']))}, {local(booking['start'])} → {local(booking['end'])}",
                  markup=False)


def reservations_table(rows: list[dict]) -> Table:
    table = Table("id", "status", "team", "user", "node", "gpus", "start", "end", "GPU-h")
    for r in rows:
        table.add_row(str(r["id"]), r["status"], r["team_name"], r["user"], r["node"],
                      ",".join(map(str, r["gpus"])), local(r["start"]), local(r["end"]), f"{r['gpu_hours']:g}")
    return table


@cli.command("ls")
@click.option("--all", "everyone", is_flag=True, help="Everyone's bookings you can see, not only yours.")
@click.option("--past", is_flag=True, help="Include bookings that have ended.")
@click.option("--status")
@json_option
@api_command
def list_bookings(everyone, past, status, as_json) -> None:
    """Your current and upcoming bookings."""
    params = {"mine": None if everyone else "1", "status": status,
              "from": None if past else dt.datetime.now(dt.UTC).isoformat()}
    rows = client_from_settings().get_all("reservations/", **params)
    emit(rows, as_json, reservations_table(rows))


def _booking_action(action: str, booking_id: int, reason: str, as_json: bool) -> None:
    booking = client_from_settings().post(f"reservations/{booking_id}/{action}/", {"reason": reason})
    if as_json:
        emit(booking, True, None)
    else:
        out.print(f"#{booking['id']} is now {booking['status']}.", markup=False)


@cli.command()
@click.argument("booking_id", type=click.IntRange(1))
@click.option("--reason", default="")
@json_option
@api_command
def cancel(booking_id, reason, as_json) -> None:
    """Cancel a booking that has not started (its GPU-hours are refunded)."""
    _booking_action("cancel", booking_id, reason, as_json)


@cli.command()
@click.argument("booking_id", type=click.IntRange(1))
@click.option("--reason", default="")
@json_option
@api_command
def release(booking_id, reason, as_json) -> None:
    """End a running booking now; the unused part is refunded."""
    _booking_action("release", booking_id, reason, as_json)


# --- jobs and runs --------------------------------------------------------------------------------


def jobs_table(rows: list[dict], *, with_estimate: bool = False) -> Table:
    columns = ["id", "name", "team", "user", "state", "priority", "gpus", "booking", "epochs", "submitted"]
    table = Table(*columns, *(["estimated start"] if with_estimate else []))
    for j in rows:
        epochs = f"{j['epochs_done']}/{j['epochs_total']}" if j.get("epochs_total") else "—"
        cells = [str(j["id"]), j["name"], j["team"], j["user"], j["state"], j["priority"], str(j["gpus_needed"]),
                 f"#{j['reservation']}" if j.get("reservation") else "queue", epochs, local(j["submitted_at"])]
        if with_estimate:
            bound = j.get("estimate_not_before")
            cells.append(local(j["estimated_start"]) if j.get("estimated_start")
                         else f"not before {local(bound)}" if bound else local(None))
        table.add_row(*cells)
    return table


@cli.command()
@click.argument("spec_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--into", "booking_id", type=click.IntRange(1), help="Run it in this booking instead of the queue.")
@json_option
@api_command
def submit(spec_file: Path, booking_id, as_json) -> None:
    """Submit a job spec (YAML or JSON); the server validates it."""
    client = client_from_settings()
    body = {"spec_yaml": spec_file.read_text(), "reservation": booking_id}
    if not as_json:
        _print_batch_advice(client, body)
    job = client.post("jobs/", body)
    if as_json:
        emit(job, True, None)
    else:
        where = f"in booking #{job['reservation']}" if job.get("reservation") else "in the queue"
        out.print(f"Submitted job #{job['id']} ({job['name']}) {where}.", markup=False)


def _print_batch_advice(client, body: dict) -> dict | None:
    """The server's batch advice for a YOLO spec ("batch 16 for a 24 GB GPU with this model")
    and any warning in words, printed before the job is submitted (issue #17)."""
    try:
        advice = client.post("jobs/advice/", body)
    except ApiError:
        return None  # not a YOLO job, or a spec the submit itself will explain
    if advice.get("advice"):
        out.print(f"Recommended: {advice['advice']} ({advice['image']}, {advice['basis']}).", markup=False)
    for warning in advice.get("warnings") or []:
        err.print(f"warning: {warning}", markup=False)
    return advice


@cli.command()
@click.argument("spec_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--into", "booking_id", type=click.IntRange(1), help="Advise for this booking's GPUs.")
@json_option
@api_command
def advise(spec_file: Path, booking_id, as_json) -> None:
    """Say what batch, epochs and exports a YOLO spec would get, without submitting it."""
    client = client_from_settings()
    body = {"spec_yaml": spec_file.read_text(), "reservation": booking_id}
    if as_json:
        emit(client.post("jobs/advice/", body), True, None)
        return
    advice = _print_batch_advice(client, body)
    if advice is None:
        client.post("jobs/advice/", body)  # raises the server's reason in words
        return
    out.print(f"It trains with batch {advice['batch']} ({advice['batch_source']}), {advice['epochs']} epochs at "
              f"imgsz {advice['imgsz']}, a checkpoint every {advice['save_period']} epochs.", markup=False)


@cli.command()
@click.option("--state", help="Only jobs in this state (queued, running, succeeded, …).")
@json_option
@api_command
def jobs(state, as_json) -> None:
    """Your teams' training jobs."""
    rows = client_from_settings().get_all("jobs/", state=state)
    emit(rows, as_json, jobs_table(rows))




@cli.command()
@json_option
@api_command
def queue(as_json) -> None:
    """Queued jobs in the order the scheduler tries them (the server's queue position: fair
    share, not only priority), then those waiting for a booking; with the estimated start where
    known: the server's estimate when it gives one, else the start of the booking."""
    client = client_from_settings()
    rows = client.get_all("jobs/", state="queued")
    booking_starts: dict[int, str] = {}
    for job in rows:
        booking_id = job.get("reservation")
        if booking_id and booking_id not in booking_starts:
            booking_starts[booking_id] = client.get(f"reservations/{booking_id}/")["start"]
        job["estimated_start"] = job.get("estimated_start") or booking_starts.get(booking_id)
    rows.sort(key=lambda j: (j.get("queue_position") is None, j.get("queue_position") or 0, j["submitted_at"], j["id"]))
    emit(rows, as_json, jobs_table(rows, with_estimate=True))


def _new_lines(previous: list[str], current: list[str]) -> list[str]:
    """Lines of `current` not yet printed, given the tail printed last time. The server returns
    a moving window of the log's last lines, so find where the old tail ends inside the new."""
    if not previous:
        return current
    for overlap in range(min(len(previous), len(current)), 0, -1):
        if previous[-overlap:] == current[:overlap]:
            return current[overlap:]
    return current


@cli.command()
@click.argument("run_id", type=click.IntRange(1))
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the run ends.")
@click.option("--interval", type=click.FloatRange(0.1, 60), default=2.0, show_default=True)
@api_command
def logs(run_id, follow, interval) -> None:
    """Print a run's log (the last 200 lines; with -f, follow it)."""
    client = client_from_settings()
    printed: list[str] = []
    while True:
        lines = client.get(f"runs/{run_id}/log/")["log"].splitlines()
        for line in _new_lines(printed, lines):
            click.echo(line)
        printed = lines
        if not follow or client.get(f"runs/{run_id}/")["state"] in FINISHED_RUN_STATES:
            if follow:  # the last lines written before it ended
                for line in _new_lines(printed, client.get(f"runs/{run_id}/log/")["log"].splitlines()):
                    click.echo(line)
            return
        time.sleep(interval)


def _progress_text(run: dict) -> str:
    progress = run.get("progress") or {}
    keys = [k for k in ("box_loss", "cls_loss", "mAP50", "mAP50-95") if k in progress]
    return " ".join(f"{k}={progress[k]:.4g}" if isinstance(progress[k], float) else f"{k}={progress[k]}" for k in keys)


@cli.command()
@click.argument("run_id", type=click.IntRange(1))
@click.option("--once", is_flag=True, help="Print the state once instead of following it.")
@click.option("--interval", type=click.FloatRange(0.1, 60), default=2.0, show_default=True)
@json_option
@api_command
def status(run_id, once, interval, as_json) -> None:
    """A run's state and epoch progress, as a live bar until it ends."""
    client = client_from_settings()
    run = client.get(f"runs/{run_id}/")
    job = client.get(f"jobs/{run['job']}/")
    if as_json:
        emit({"run": run, "job": job}, True, None)
        return
    out.print(f"Run #{run['id']} of job #{job['id']} ({job['name']}) on node {run['node']}, GPUs "
              f"{','.join(map(str, run['gpu_indices']))} — {run['kind']}, started {local(run['started_at'])}",
              markup=False)
    total = job.get("epochs_total")
    tune = bool((job.get("spec") or {}).get("tune"))  # a tune's progress counts iterations (the job's)
    with Progress(TextColumn("{task.fields[state]}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("iterations" if tune else "epochs"),
                  TextColumn("{task.fields[metrics]}"), TimeElapsedColumn(), console=out,
                  transient=False, disable=False) as bar:
        task = bar.add_task("run", total=total, state=run["state"], metrics="")
        while True:
            if tune:
                epoch = client.get(f"jobs/{job['id']}/")["epochs_done"]
            else:
                epoch = (run.get("progress") or {}).get("epoch") or job.get("epochs_done") or 0
            bar.update(task, completed=epoch, state=run["state"], metrics=_progress_text(run))
            if once or run["state"] in FINISHED_RUN_STATES:
                break
            time.sleep(interval)
            run = client.get(f"runs/{run_id}/")
    if run["state"] in FINISHED_RUN_STATES:
        out.print(f"Run #{run['id']} {run['state']} at {local(run['ended_at'])}"
                  + (f": {run['reason']}" if run.get("reason") else ""), markup=False)


# --- the model registry and tuned specs (issue #17) ----------------------------------------------


@cli.group()
def models() -> None:
    """The model registry: your teams' named, versioned models ("vision/pcb-defect" v3)."""


def resolve_model(client: Client, model: str) -> dict:
    """A model given by id or by its full name (team/name)."""
    listed = client.get_all("models/")
    found = next((m for m in listed if str(m["id"]) == model or m["full_name"] == model), None)
    if found is None:
        raise click.ClickException(f"no model {model!r} (`gpubook models list` shows yours)")
    return found


@models.command("list")
@json_option
@api_command
def models_list(as_json) -> None:
    """Your teams' models and their latest versions."""
    rows = client_from_settings().get_all("models/")
    table = Table("id", "model", "latest version", "created")
    for m in rows:
        table.add_row(str(m["id"]), m["full_name"], f"v{m['latest_version']}" if m["latest_version"] else "—",
                      local(m["created_at"]))
    emit(rows, as_json, table)


@models.command("versions")
@click.argument("model")
@json_option
@api_command
def models_versions(model, as_json) -> None:
    """A model's versions with their headline metrics and files."""
    client = client_from_settings()
    rows = client.get(f"models/{resolve_model(client, model)['id']}/")
    table = Table("version", "run", "mAP50-95", "mAP50", "promoted by", "promoted", "files")
    for v in rows:
        metrics = v.get("metrics") or {}
        table.add_row(f"v{v['version']}", f"#{v['run']}", str(metrics.get("mAP50-95", "—")),
                      str(metrics.get("mAP50", "—")), v["promoted_by"], local(v["promoted_at"]),
                      ", ".join(f["name"] for f in v["files"]))
    emit(rows, as_json, table)


@models.command("promote")
@click.argument("run_id", type=click.IntRange(1))
@click.argument("name")
@click.option("--note", default="", help="Why this version (shown with it).")
@json_option
@api_command
def models_promote(run_id, name, note, as_json) -> None:
    """Make a succeeded run's best weights the next version of the team's model NAME."""
    version = client_from_settings().post("models/promote/", {"run": run_id, "name": name, "note": note})
    if as_json:
        emit(version, True, None)
    else:
        out.print(f"Run #{run_id} is {version['model']} v{version['version']}.", markup=False)


@models.command("compare")
@click.argument("model")
@click.argument("a", type=click.IntRange(1))
@click.argument("b", type=click.IntRange(1))
@json_option
@api_command
def models_compare(model, a, b, as_json) -> None:
    """Two versions' metrics side by side (change = B - A)."""
    client = client_from_settings()
    found = client.get(f"models/{resolve_model(client, model)['id']}/compare/", a=a, b=b)
    table = Table("metric", f"v{a}", f"v{b}", "change")
    for row in found["metrics"]:
        change = row["change"]
        table.add_row(row["metric"], str(row["a"] if row["a"] is not None else "—"),
                      str(row["b"] if row["b"] is not None else "—"), "—" if change is None else f"{change:+.4g}")
    emit(found, as_json, table)


@models.command("download")
@click.argument("model")
@click.argument("version", type=click.IntRange(1))
@click.argument("name")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write it (default: MODEL-vVERSION-NAME here).")
@api_command
def models_download(model, version, name, output) -> None:
    """Download a file of a version: its weights (best.pt) or any export (best.onnx, ...)."""
    client = client_from_settings()
    found = resolve_model(client, model)
    target = output or Path(f"{found['name']}-v{version}-{name}")
    size = client.download(f"models/{found['id']}/file/", target, version=version, name=name)
    out.print(f"Wrote {target} ({size} bytes).", markup=False)


@cli.command()
@click.argument("job_id", type=click.IntRange(1))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the spec to this file (default: print it).")
@api_command
def tuned(job_id, output) -> None:
    """The spec a tune job's best values make (JSON, which `gpubook submit` reads as YAML)."""
    found = client_from_settings().get(f"jobs/{job_id}/tuned-spec/")
    text = json.dumps(found["spec"], indent=2) + "\n"
    if output is None:
        click.echo(text, nl=False)
        return
    output.write_text(text)
    err.print(f"Iteration {found['iteration']} (fitness {found['fitness']:.5g}) written to {output}; "
              f"submit it with `gpubook submit {output}`.", markup=False)
