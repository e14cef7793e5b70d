"""deploy/systemd: the gpu_agent unit runs a command that exists, with what it needs."""

import shlex

from tests.deploy.commands import problems
from tests.deploy.conftest import DEPLOY


def unit(path) -> dict[str, list[str]]:
    entries: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, _, value = line.partition("=")
            entries.setdefault(key, []).append(value)
    return entries


def test_gpu_agent_unit_runs_the_agent():
    entries = unit(DEPLOY / "systemd" / "gpubook-gpu-agent.service")
    argv = shlex.split(entries["ExecStart"][0])
    assert argv[0].endswith("/bin/python")
    assert problems(["python", *argv[1:]]) == [] and argv[2] == "gpu_agent"
    environment = dict(item.split("=", 1) for item in entries["Environment"])
    assert environment["DEBUG"] == "false" and len(environment["SECRET_KEY"]) >= 50
    assert environment["GPUBOOK_BASE_URL"].startswith("https://")
    assert entries["EnvironmentFile"] == ["/etc/gpubook/gpu-agent.env"]  # GPUBOOK_AGENT_TOKEN lives there
    assert entries["User"] == ["gpubook"] and entries["NoNewPrivileges"] == ["true"]
    assert entries["Restart"] == ["always"] and entries["WantedBy"] == ["multi-user.target"]
