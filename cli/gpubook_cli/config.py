"""Where the CLI keeps its server address and token: one JSON file, readable by its owner only."""

import json
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8000"


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpubook"


def config_path() -> Path:
    return config_dir() / "config.json"


@dataclass(frozen=True)
class Settings:
    url: str
    token: str | None


def load() -> Settings:
    """The saved settings, with GPUBOOK_URL / GPUBOOK_TOKEN taking precedence."""
    saved: dict = {}
    try:
        saved = json.loads(config_path().read_text())
    except (FileNotFoundError, ValueError):
        saved = {}
    url = os.environ.get("GPUBOOK_URL") or saved.get("url") or DEFAULT_URL
    token = os.environ.get("GPUBOOK_TOKEN") or saved.get("token")
    return Settings(url=url.rstrip("/"), token=token)


def save(*, url: str, token: str) -> Path:
    """Write the file with mode 0600 from the start: the token must never be readable by others,
    not even for the moment between creating the file and a chmod."""
    directory = config_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = config_path()
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url.rstrip("/"), "token": token}, f)
    os.chmod(temporary, 0o600)  # in case the file existed with looser bits
    os.replace(temporary, path)
    return path


def forget() -> bool:
    try:
        config_path().unlink()
    except FileNotFoundError:
        return False
    return True
