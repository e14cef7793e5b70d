"""Keep Ultralytics off the network (recipes/ultralytics-offline.md §2).

:func:`prepare_environment` must run before ``import ultralytics``: most of what Ultralytics
reaches for is decided at import time. :func:`quiet_settings` runs right after the import.
Verified with an audit hook: together they leave zero DNS lookups and connects for train,
validate, resume and ONNX export.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

_FONT_NAMES = ("Arial.ttf", "Arial.Unicode.ttf")


def prepare_environment(config_dir: Path) -> None:
    """Set the offline switches and a per-run Ultralytics config dir with local fonts."""
    os.environ["YOLO_OFFLINE"] = "1"  # online check, pip update check, analytics, Sentry
    os.environ["YOLO_CONFIG_DIR"] = str(config_dir)  # settings.json per run, never ~/.config
    os.environ.pop("ULTRALYTICS_API_KEY", None)  # the Platform callback streams when this is set
    # OpenVINO's model converter (the `openvino` export) sends usage events to Google Analytics
    # unless a consent file in $HOME says no; every place it imports openvino_telemetry falls
    # back to a silent stub on ImportError, and a None entry in sys.modules makes that import
    # fail (caught by the network audit in tests/training/runner/test_exports.py).
    sys.modules.setdefault("openvino_telemetry", None)
    if not _writable_home():
        # onnxruntime and matplotlib write caches under $HOME.
        os.environ.setdefault("MPLCONFIGDIR", str(config_dir / "matplotlib"))
    fonts = config_dir / "Ultralytics"
    fonts.mkdir(parents=True, exist_ok=True)
    # check_font('Arial.ttf') fetches from GitHub even with YOLO_OFFLINE=1 unless the font is
    # already in the config dir; any TTF will do, and matplotlib ships DejaVuSans.
    source = _dejavu_sans()
    for name in _FONT_NAMES:
        target = fonts / name
        if not target.exists() and source is not None:
            shutil.copyfile(source, target)


def quiet_settings(runs_dir: Path) -> None:
    """Turn off sync (analytics), the Platform key and every logger integration.

    Only keys the installed Ultralytics knows are set (``settings.update`` rejects others).
    """
    from ultralytics import settings

    wanted = {
        "sync": False,
        "api_key": "",
        "clearml": False,
        "comet": False,
        "dvc": False,
        "mlflow": False,
        "neptune": False,
        "raytune": False,
        "tensorboard": False,
        "wandb": False,
        "vscode_msg": False,
        "openvino_msg": False,
        "runs_dir": str(runs_dir),
    }
    settings.update({key: value for key, value in wanted.items() if key in settings})


def _dejavu_sans() -> Path | None:
    spec = importlib.util.find_spec("matplotlib")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        font = Path(location) / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf"
        if font.is_file():
            return font
    return None


def _writable_home() -> bool:
    home = os.environ.get("HOME")
    return bool(home) and os.access(home, os.W_OK)
