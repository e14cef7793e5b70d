"""Does a container's argv name something that exists in this repository? Shared by the
compose, Kubernetes, systemd and entrypoint tests, so a renamed management command or Celery
app path breaks a test instead of a deployment."""

import importlib
import pathlib
import shlex

from tests.deploy.conftest import ROOT

IN_IMAGE = pathlib.PurePosixPath("/app")  # where app.Dockerfile puts the repository
CELERY_SUBCOMMANDS = {"worker", "beat", "inspect"}


def repo_path(path: str) -> pathlib.Path:
    """A path inside the image (/app/…) or relative to the repository, on this checkout."""
    pure = pathlib.PurePosixPath(path)
    if pure.is_absolute():
        pure = pure.relative_to(IN_IMAGE)
    return ROOT / pure


def problems(argv: list[str] | str) -> list[str]:
    """Why this command would not run in the app image ([] when it would)."""
    from celery import Celery
    from celery.app.utils import find_app
    from django.core.management import get_commands

    if isinstance(argv, str):
        argv = shlex.split(argv)
    if not argv:
        return ["empty command"]
    program, *rest = argv
    if program in {"python", "python3"} and rest[:1] == ["manage.py"]:
        name = rest[1] if len(rest) > 1 else ""
        return [] if name in get_commands() else [f"manage.py has no command {name!r}"]
    if program in {"python", "python3"} and rest and rest[0].endswith(".py"):
        return [] if repo_path(rest[0]).is_file() else [f"no script {rest[0]}"]
    if program == "celery":
        if rest[:1] != ["-A"] or len(rest) < 3:
            return [f"celery without -A APP SUBCOMMAND: {argv}"]
        app = find_app(rest[1])
        found = []
        if not isinstance(app, Celery):
            found.append(f"-A {rest[1]} is not a Celery app")
        if rest[2] not in CELERY_SUBCOMMANDS:
            found.append(f"unknown celery subcommand {rest[2]!r}")
        return found
    if program == "gunicorn":
        module, _, attribute = rest[0].partition(":")
        return [] if callable(getattr(importlib.import_module(module), attribute or "application", None)) else [
            f"{rest[0]} is not a WSGI application"
        ]
    return [f"unknown program {program!r}"]
