"""The trainer image definition (deploy/images): checked as text, no Docker needed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from tests.training.runner.support import REPO_ROOT

IMAGES = REPO_ROOT / "deploy" / "images"
CATALOG = {"yolo:v8n-cu118": "cuda11.8", "yolo:v8x-cu118": "cuda11.8", "yolo:v10l-cu121": "cuda12.1"}


def test_dockerfile_runs_the_runner_as_non_root_under_an_init():
    text = (IMAGES / "trainer.Dockerfile").read_text()
    [entrypoint] = re.findall(r"^ENTRYPOINT (.+)$", text, flags=re.MULTILINE)
    argv = json.loads(entrypoint)  # exec form: a JSON array, no shell in between
    assert argv[:2] == ["/usr/bin/tini", "--"] and argv[-2:] == ["-m", "training.runner"]
    users = re.findall(r"^USER (\S+)", text, flags=re.MULTILINE)
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert re.search(r"^ARG UID=(\d+)$", text, flags=re.MULTILINE).group(1) != "0"
    assert "COPY training/runner/" in text and "requirements-training.txt" in text
    rules = [
        line.strip()
        for line in (IMAGES / "trainer.Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*"  # allowlist: only what the image needs is sent (never .venv)
    assert "!training/runner/" in rules


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_build_script_knows_the_catalog_tags():
    result = subprocess.run(
        ["bash", str(IMAGES / "build.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    # The app image (deploy/images/app.Dockerfile) is built too; the catalog is about trainers.
    lines = [line for line in result.stdout.splitlines() if "trainer.Dockerfile" in line]
    assert len(lines) == len(CATALOG)
    for line, (tag, cuda) in zip(lines, CATALOG.items(), strict=True):
        assert f"-t {tag} " in line and cuda in line and "trainer.Dockerfile" in line
    unknown = subprocess.run(
        ["bash", str(IMAGES / "build.sh"), "yolo:nope"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert unknown.returncode == 2 and "unknown tag" in unknown.stderr
