"""`manage.py gpu_agent`: the telemetry agent of one GPU host, or (`--issue-token NODE`) the
admin's way to mint that host's token.

On a GPU host:  GPUBOOK_AGENT_TOKEN=gpa_… python manage.py gpu_agent --url https://gpubook/api/v1/telemetry/samples/
The agent needs no database: only NVML and the URL. Where NVML is absent it says so once and
keeps running (a driver installed later is picked up), reporting nothing meanwhile.
"""

import os
import signal
import socket
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from gpus.models import Node
from gpus.telemetry.agent import Agent
from gpus.telemetry.store import agent_token_issue


class Command(BaseCommand):
    help = "Sample this host's GPUs and post minute buckets to gpubook (or mint a node token)."

    def add_arguments(self, parser):
        parser.add_argument("--url", default="", help="the samples endpoint (default: GPUBOOK_BASE_URL + path)")
        parser.add_argument("--node-name", default=socket.gethostname(), help="this host's node name")
        parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
        parser.add_argument("--once", action="store_true", help="take one sample and exit (nothing is posted "
                            "until a minute has closed)")
        parser.add_argument("--issue-token", metavar="NODE", help="print a new agent token for NODE and exit")

    def handle(self, *args, url, node_name, interval, once, issue_token, **options):
        if issue_token:
            node = Node.objects.filter(name=issue_token).first()
            if node is None:
                raise CommandError(f"No node named {issue_token!r}; register it with `manage.py discover_gpus`.")
            _, token = agent_token_issue(node=node, now=timezone.now(), description="issued by gpu_agent")
            self.stdout.write(token)
            return
        token = os.environ.get("GPUBOOK_AGENT_TOKEN", "")
        if not token:
            raise CommandError("Set GPUBOOK_AGENT_TOKEN (mint one with `manage.py gpu_agent --issue-token NODE`).")
        url = url or f"{settings.GPUBOOK_BASE_URL.rstrip('/')}/api/v1/telemetry/samples/"
        try:
            agent = Agent(url=url, token=token, node_name=node_name)
        except ValueError as error:
            raise CommandError(str(error)) from error
        stopping = []
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
        self.stdout.write(f"gpu_agent: {node_name} → {url} every {interval:g} s")
        try:
            while not stopping:
                tick = agent.run_once(timezone.now())
                if tick.error:
                    self.stderr.write(f"post failed: {tick.error} ({tick.pending} bucket(s) pending)")
                if once:
                    return
                time.sleep(interval)
        except KeyboardInterrupt:
            pass
        finally:
            agent.sampler.close()
