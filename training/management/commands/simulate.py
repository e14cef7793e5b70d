"""`python manage.py simulate`: the trace-replay simulator (scheduler.sim) under Django's
command runner. All options are the simulator's own (`python -m scheduler.sim -h`), so
this command hands argv over untouched instead of declaring them twice."""

from django.core.management.base import BaseCommand, CommandError

from scheduler.sim import cli as simulate


class Command(BaseCommand):
    help = "Replay a GPU job trace through gpubook's plan() and the FIFO baselines."

    def run_from_argv(self, argv: list[str]) -> None:
        # The simulator parses its own arguments (argv[2:] follows "manage.py simulate").
        try:
            status = simulate.main(argv[2:])
        except SystemExit as exit_request:
            status = exit_request.code
        if status not in (0, None):
            raise CommandError(f"simulate failed ({status})", returncode=status if isinstance(
                status, int) else 1)

    def add_arguments(self, parser) -> None:
        parser.add_argument("simulator_arguments", nargs="*")

    def handle(self, *args, simulator_arguments: list[str], **options) -> None:
        # call_command("simulate", "--", "--trace", path): arguments go through unparsed.
        simulate.main(simulator_arguments)
