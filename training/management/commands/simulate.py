"""`python manage.py simulate`: the trace-replay simulator (scheduler.sim) under Django's
command runner. All options are the simulator's own (`python -m scheduler.sim -h`), so
this command hands argv over untouched instead of declaring them twice.

`python manage.py simulate --from-history [--since 30d] [--policy gpubook] [--set FIELD=VALUE
...]` instead replays gpubook's own jobs and bookings of the last days under the current
settings and under the chosen policy (`training.whatif`) and prints both rows of the
evaluation matrix's table."""

import argparse
import datetime as dt
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from scheduler.sim import cli as simulate
from scheduler.sim.policies import POLICY_NAMES, policy_overrides
from scheduler.sim.trace import parse_duration
from training import whatif

FROM_HISTORY = "--from-history"


def history_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="manage.py simulate --from-history",
        description="What would another policy have done with this server's own history?",
    )
    parser.add_argument(FROM_HISTORY, action="store_true", required=True)
    parser.add_argument("--since", default="30d", help="how far back (s/m/h/d suffix; default 30d)")
    parser.add_argument("--until", help="end of the window, ISO 8601 (default: now)")
    parser.add_argument("--policy", default="gpubook", choices=POLICY_NAMES,
                        help="the policy to compare with the current settings (default gpubook)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a scheduler.Policy field for the what-if row (repeatable)")
    parser.add_argument("--max-jobs", type=int, help="replay only the most recent N queued jobs")
    parser.add_argument("--html", type=Path, help="write the plotly report here")
    parser.add_argument("--export-trace", type=Path, help="also write the jobs as a trace CSV here")
    return parser


class Command(BaseCommand):
    help = "Replay a GPU job trace (or this server's history) through gpubook's plan() and baselines."

    def run_from_argv(self, argv: list[str]) -> None:
        # The simulator parses its own arguments (argv[2:] follows "manage.py simulate").
        try:
            status = self._dispatch(argv[2:])
        except SystemExit as exit_request:
            status = exit_request.code
        if status not in (0, None):
            raise CommandError(f"simulate failed ({status})", returncode=status if isinstance(
                status, int) else 1)

    def add_arguments(self, parser) -> None:
        parser.add_argument("simulator_arguments", nargs="*")

    def handle(self, *args, simulator_arguments: list[str], **options) -> None:
        # call_command("simulate", "--", "--trace", path): arguments go through unparsed.
        self._dispatch(simulator_arguments)

    def _dispatch(self, argv: list[str]) -> int:
        if FROM_HISTORY in argv:
            return self._from_history(argv)
        return simulate.main(argv)

    def _from_history(self, argv: list[str]) -> int:
        arguments = history_parser().parse_args(argv)
        try:
            overrides = policy_overrides(arguments.set)
            since = dt.timedelta(seconds=parse_duration(arguments.since))
        except ValueError as error:
            raise CommandError(str(error)) from None
        now = timezone.now()
        if arguments.until:
            now = parse_datetime(arguments.until)
            if now is None:
                raise CommandError(f"--until {arguments.until!r} is not an ISO 8601 date-time")
            if timezone.is_naive(now):
                now = timezone.make_aware(now)
        try:
            report = whatif.history_whatif(
                now=now, since=since, policy_name=arguments.policy, overrides=overrides,
                max_jobs=arguments.max_jobs, html=arguments.html,
            )
        except ValueError as error:
            raise CommandError(str(error)) from None
        export = report.export
        if arguments.export_trace:
            whatif.write_trace_csv(export, arguments.export_trace)
        workload = export.workload
        self.stdout.write(
            f"history {export.window_start:%Y-%m-%d %H:%M} to {export.window_end:%Y-%m-%d %H:%M %Z}: "
            f"{export.jobs_exported} training jobs exported ({export.jobs_skipped} left out), "
            f"{len(workload.bookings)} bookings, {len(workload.jobs)} jobs replayed on {len(export.gpus)} GPUs"
        )
        self.stdout.write(report.table)
        return 0
