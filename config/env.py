"""Typed environment helpers that fail loudly on bad values.

A typo in production configuration should stop the process at start-up with a message naming
the variable, never run with a silently different value.
"""

import os
from urllib.parse import unquote, urlparse


class ConfigError(RuntimeError):
    pass


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean (use true/false)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name}={value} must be at least {minimum}")
    return value


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_choice(name: str, default: str, choices: set[str]) -> str:
    value = os.environ.get(name) or default
    if value not in choices:
        raise ConfigError(f"{name}={value!r} must be one of {sorted(choices)}")
    return value


def database_from_url(url: str, *, base_dir: str) -> dict:
    """Turn DATABASE_URL (postgres://user:pass@host:port/name or sqlite:///path) into settings."""
    parsed = urlparse(url)
    if parsed.scheme in {"postgres", "postgresql"}:
        name = parsed.path.lstrip("/")
        if not name:
            raise ConfigError("DATABASE_URL names no database")
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(name),
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(parsed.port or ""),
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
            # No JIT: this app's statements are short, and the reports' joins are estimated far
            # above their real cost, so JIT compiled them for seconds to run milliseconds (#19).
            "OPTIONS": {"options": "-c jit=off"},
        }
    if parsed.scheme == "sqlite":
        path = parsed.path or ""
        # sqlite:///relative.db → "relative.db"; sqlite:////abs/path.db → "/abs/path.db"
        path = path[1:] if path.startswith("/") else path
        if not path:
            raise ConfigError("DATABASE_URL=sqlite:/// needs a file path")
        if not os.path.isabs(path):
            path = os.path.join(base_dir, path)
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": path,
            # IMMEDIATE: the booking check-then-insert must be serialized (DESIGN.md).
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
        }
    raise ConfigError(f"DATABASE_URL scheme {parsed.scheme!r} is not supported (postgres, sqlite)")


def env_header_pair(name: str) -> tuple[str, str] | None:
    """`X-Forwarded-Proto: https` → ("HTTP_X_FORWARDED_PROTO", "https"), the form Django's
    SECURE_PROXY_SSL_HEADER wants; unset or empty → None."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    header, sep, value = raw.partition(":")
    header, value = header.strip(), value.strip()
    if not sep or not header or not value or not all(c.isalnum() or c == "-" for c in header):
        raise ConfigError(f"{name}={raw!r} must look like 'X-Forwarded-Proto: https'")
    return "HTTP_" + header.upper().replace("-", "_"), value
