"""Revoke node agent tokens: `manage.py revoke_node_token NODE` (all of the node's tokens) or
`--id N` (one). A revoked token is refused at once by the telemetry endpoint."""

from django.core.management.base import BaseCommand, CommandError

from gpus.models import NodeAgentToken


class Command(BaseCommand):
    help = "Revoke a node's agent tokens (all of them, or one by --id)."

    def add_arguments(self, parser):
        parser.add_argument("node", nargs="?", help="the node's name")
        parser.add_argument("--id", type=int, help="revoke only this token")

    def handle(self, *args, node=None, id=None, **options):
        tokens = NodeAgentToken.objects.filter(revoked=False)
        if id is not None:
            tokens = tokens.filter(pk=id)
        elif node:
            tokens = tokens.filter(node__name=node)
        else:
            raise CommandError("name a node, or a token with --id")
        count = tokens.update(revoked=True)
        if not count:
            raise CommandError("no live token matched")
        self.stdout.write(f"Revoked {count} token(s).")
