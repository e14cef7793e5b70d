"""The artifact manifest: what a finished run leaves behind, with sizes and checksums.

``output_dir/artifacts.json``::

    {
      "run_id": "42",
      "output_dir": "/runs/42",                # absolute, as the runner saw it
      "created": "2026-11-29T17:02:03.123Z",
      "artifacts": [
        {"name": "best.pt", "kind": "weights", "path": "train/weights/best.pt",
         "size": 6245123, "sha256": "9f2c…"},
        ...
      ]
    }

``path`` is relative to ``output_dir`` (POSIX separators), so the manifest stays right when the
web app mounts the runs volume somewhere else. Kinds: ``weights`` (best.pt, last.pt),
``export`` (best.onnx, ...), ``metrics`` (results.csv), ``config`` (args.yaml).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from training.runner.progress import utc_now_iso

MANIFEST_FILE = "artifacts.json"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def describe(path: Path, output_dir: Path, kind: str) -> dict[str, Any]:
    try:
        relative = path.resolve().relative_to(output_dir.resolve()).as_posix()
    except ValueError:
        relative = str(path)
    return {
        "name": path.name,
        "kind": kind,
        "path": relative,
        "size": path.stat().st_size,
        "sha256": sha256_of(path),
    }


def write_manifest(
    run_id: str, output_dir: Path, files: Iterable[tuple[Path, str]]
) -> tuple[Path, list[dict[str, Any]]]:
    """Describe every existing file of ``files`` ((path, kind) pairs) in artifacts.json."""
    artifacts = [describe(path, output_dir, kind) for path, kind in files if path.is_file()]
    manifest = {
        "run_id": run_id,
        "output_dir": str(output_dir),
        "created": utc_now_iso(),
        "artifacts": artifacts,
    }
    target = output_dir / MANIFEST_FILE
    tmp = output_dir / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    tmp.replace(target)
    return target, artifacts
