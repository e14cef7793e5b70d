"""The node agent (`manage.py gpu_agent`): sample NVML every few seconds, fold the samples into
minute buckets, POST the closed buckets to the web app with the node's token.

`Agent.run_once(now)` is one iteration (tested directly); the command only loops and sleeps.
Buckets that could not be posted are kept (bounded) and sent with the next post, so a web
app restart loses no minutes; the server replaces a repeated (GPU, minute), so a retried post
never counts twice.
"""

import collections
import dataclasses
import datetime as dt
import json
import logging
import urllib.error
import urllib.request

from gpus.telemetry.buckets import MinuteAggregator
from gpus.telemetry.nvml import NvmlSampler

logger = logging.getLogger(__name__)
MAX_PENDING_BUCKETS = 50_000  # about 4 days of an 8-GPU node
POST_TIMEOUT_S = 10.0


@dataclasses.dataclass
class AgentTick:
    sampled: int = 0
    posted: int = 0
    pending: int = 0
    error: str = ""


def post_json(url: str, token: str, body: dict, *, timeout: float = POST_TIMEOUT_S) -> dict:
    """POST `body`; raise OSError (URLError/HTTPError are OSErrors) on any failure."""
    request = urllib.request.Request(  # noqa: S310 — the URL is the operator's --url (http/https checked)
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        return json.loads(response.read() or b"{}")


class Agent:
    def __init__(self, *, url: str, token: str, node_name: str, sampler=None, post=post_json) -> None:
        if not url.lower().startswith(("http://", "https://")):
            raise ValueError(f"the agent posts to http(s) URLs only, not {url!r}")
        self.url = url
        self.token = token
        self.node_name = node_name
        self.sampler = sampler or NvmlSampler()
        self.aggregator = MinuteAggregator()
        self.pending: collections.deque = collections.deque(maxlen=MAX_PENDING_BUCKETS)
        self._post = post

    def run_once(self, now: dt.datetime) -> AgentTick:
        tick = AgentTick()
        readings = self.sampler.sample()
        tick.sampled = len(readings)
        self.aggregator.add(readings, at=now)
        self.pending.extend(self.aggregator.drain(now=now))
        if self.pending:
            batch = list(self.pending)
            try:
                answer = self._post(self.url, self.token, {"node": self.node_name, "buckets": batch})
            except (OSError, ValueError) as error:
                tick.error = str(error)
                if isinstance(error, urllib.error.HTTPError) and error.code in (400, 401, 403):
                    # the server will never take these (bad token, bad data): drop, don't loop forever
                    logger.error("telemetry post refused (%s); %d bucket(s) dropped", error, len(batch))
                    self.pending.clear()
                else:
                    logger.warning("telemetry post failed (%s); %d bucket(s) kept for later", error, len(batch))
            else:
                self.pending.clear()
                tick.posted = len(batch)
                if answer.get("unknown_gpus"):
                    logger.warning("the server does not know GPU(s) %s of %s: run `manage.py discover_gpus` there",
                                   answer["unknown_gpus"], self.node_name)
        tick.pending = len(self.pending)
        return tick
