"""Shared set-up for benchmarks: a fresh PostgreSQL database of their own, and Django on it."""

import os
import subprocess
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
SERVER = "postgres://postgres@127.0.0.1:5432"


def fresh_database(name: str) -> str:
    """Drop and recreate `name`, migrate it, and return its URL."""
    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        connection.execute(f"CREATE DATABASE {name}")
    url = f"{SERVER}/{name}"
    env = {**os.environ, "DATABASE_URL": url, "SECRET_KEY": "bench", "DEBUG": "false"}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    return url


def django_on(url: str, **extra_env: str) -> None:
    os.environ.update(DATABASE_URL=url, SECRET_KEY="bench", DJANGO_SETTINGS_MODULE="config.settings", **extra_env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]
