"""Helpers for the deployment tests: the repository root and the documented production env."""

import pathlib
import secrets
import string

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def production_env(**extra: str) -> dict[str, str]:
    """deploy/production.env as a dict, plus a fresh 64-character SECRET_KEY."""
    env = {}
    for line in (DEPLOY / "production.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    alphabet = string.ascii_letters + string.digits + "!@#%^&*(-_=+)"
    env["SECRET_KEY"] = "".join(secrets.choice(alphabet) for _ in range(64))
    env.update(extra)
    return env
