"""The run spec: what one runner process trains, read from a JSON file and validated strictly.

Example (every field; the optional ones show their defaults)::

    {
      "run_id": "42",                      # str or int; letters, digits, . _ - (max 128)
      "model": "yolov8n.yaml",             # a built-in model YAML name, a model YAML path,
                                           # or a weights file (.pt) on a mounted volume
      "data": "/data/shapes/data.yaml",    # data YAML path (must exist)
      "epochs": 30,                        # int >= 1
      "imgsz": 640,                        # int 32..8192
      "batch": 16,                         # int >= 1, or -1 for Ultralytics AutoBatch
      "device": [0],                       # CUDA indices (as the process sees them) or "cpu";
                                           # several: one DDP worker per GPU (ddp.py)
      "allow_gpu_count_change": false,     # resume a checkpoint trained on another number of GPUs
      "workers": 2,                        # DataLoader worker processes, >= 0 (honoured on CPU too)
      "output_dir": "/runs/42",            # created if missing; everything the run writes goes here
      "resume_from": null,                 # a resumable last.pt (e.g. the previous run's)
      "must_end_by": "2026-11-29T18:00:00Z",  # ISO-8601 with a zone; stop by itself before this
      "grace_s": 60,                       # stop this long before must_end_by
      "report_url": "https://gpubook.example/api/runs/42/report",
      "report_token": "…",                 # required with report_url
      "partial_epoch": "redo",             # a stop mid-epoch: "redo" that epoch on resume, or "skip" it
      "export": ["onnx"],                  # export formats at the end ([] for none)
      "extra": {"lr0": 0.01, "mosaic": 0}, # extra Ultralytics train args, allowlisted (EXTRA_ARGS)
      "tune": null                         # hyper-parameter tuning instead of one training (tune.py):
                                           # {"iterations": 30, "space": {"lr0": [1e-5, 0.1],
                                           #  "momentum": [0.6, 0.98, 0.3]}}; epochs are per
                                           # iteration; one GPU or the CPU, no export, no resume_from
    }

Relative paths are resolved against the current directory. Unknown fields are errors: a typo
must not silently fall back to a default. Validation needs only the standard library, so
``--check`` works without torch.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

__all__ = ["EXTRA_ARGS", "RunSpec", "SpecError", "TuneSpec", "load_spec", "parse_spec", "parse_tune"]


class SpecError(ValueError):
    """The spec is invalid. ``field`` names the offending field (``"extra.lr0"`` for nested)."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"spec field '{field}': {problem}" if field else f"spec: {problem}")


# --- extra Ultralytics train arguments ------------------------------------------------------
# Only arguments that change *how* the model learns are allowed. Everything the runner owns
# (model, data, epochs, imgsz, batch, device, workers, project/name/save_dir, resume, save) has
# its own field or is fixed; `time` is refused because Ultralytics ends a timed run through a
# path that strips last.pt (not resumable); `pretrained` may only be a bool (a path could make
# Ultralytics fetch weights).


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _boolean(value: Any) -> bool:
    return isinstance(value, bool)


def _one_of(*choices: Any) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        return any(value == c and type(value) is type(c) for c in choices)

    check.__doc__ = "one of " + ", ".join(json.dumps(c) for c in choices)
    check.choices = choices  # the API schema's enum (training/jobspec.py json_schema)
    return check


def _freeze(value: Any) -> bool:
    return _integer(value) or (isinstance(value, list) and all(_integer(v) for v in value))


_number.__doc__ = "a number"
_integer.__doc__ = "an integer"
_boolean.__doc__ = "true or false"
_freeze.__doc__ = "an integer or a list of integers"

EXTRA_ARGS: Mapping[str, Callable[[Any], bool]] = MappingProxyType(
    {
        **dict.fromkeys(
            (
                "lr0",
                "lrf",
                "momentum",
                "weight_decay",
                "warmup_epochs",
                "warmup_momentum",
                "warmup_bias_lr",
                "box",
                "cls",
                "dfl",
                "pose",
                "kobj",
                "dropout",
                "fraction",
                "multi_scale",
                "hsv_h",
                "hsv_s",
                "hsv_v",
                "degrees",
                "translate",
                "scale",
                "shear",
                "perspective",
                "flipud",
                "fliplr",
                "bgr",
                "mosaic",
                "mixup",
                "cutmix",
                "copy_paste",
                "erasing",
                "iou",
            ),
            _number,
        ),
        **dict.fromkeys(
            ("patience", "close_mosaic", "seed", "nbs", "mask_ratio", "max_det", "save_period"),
            _integer,
        ),
        **dict.fromkeys(
            ("cos_lr", "deterministic", "single_cls", "rect", "val", "plots", "overlap_mask", "pretrained", "compile"),
            _boolean,
        ),
        "amp": _one_of(True, False, "bf16"),
        "cache": _one_of(True, False, "ram", "disk"),
        "freeze": _freeze,
        "optimizer": _one_of("auto", "SGD", "Adam", "Adamax", "AdamW", "NAdam", "RAdam", "RMSProp", "MuSGD"),
        "copy_paste_mode": _one_of("flip", "mixup"),
        "auto_augment": _one_of("randaugment", "autoaugment", "augmix"),
    }
)

_ARG_SCHEMAS: Mapping[Callable[[Any], bool], dict[str, Any]] = {
    _number: {"type": "number"},
    _integer: {"type": "integer"},
    _boolean: {"type": "boolean"},
    _freeze: {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer"}}]},
}


def extra_args_schema() -> dict[str, Any]:
    """EXTRA_ARGS as a JSON Schema object, for the API's job spec schema: the same checks."""
    properties = {name: _ARG_SCHEMAS.get(check) or {"enum": list(check.choices)} for name, check in EXTRA_ARGS.items()}
    return {"type": "object", "additionalProperties": False, "properties": properties}


# --- hyper-parameter tuning (a job's `tune:`; the runner's tune.py) ----------------------------
# The one validator of a tune section: the job spec parser (training/jobspec.py) and the run
# spec below both call parse_tune. A search space may name only allowlisted numeric train
# arguments, so the best values it finds are always a valid `yolo.extra` of a new job.

MAX_TUNE_ITERATIONS = 1000
# Ultralytics' model.tune() trains with AdamW unless told otherwise: with "auto" the optimizer
# picks its own learning rate and momentum, and tuning lr0 would change nothing. The job that
# the best values make trains with the same optimizer.
TUNE_DEFAULT_OPTIMIZER = "AdamW"


@dataclass(frozen=True)
class TuneSpec:
    iterations: int
    # name -> (low, high) or (low, high, gain); None: Ultralytics' own default space, less the
    # arguments the allowlist does not take
    space: Mapping[str, tuple[float, ...]] | None = None

    def as_json(self) -> dict[str, Any]:
        space = None if self.space is None else {key: list(bounds) for key, bounds in self.space.items()}
        return {"iterations": self.iterations, "space": space}


def tunable(name: str) -> bool:
    """A numeric allowlisted train argument: what a search space may name."""
    return EXTRA_ARGS.get(name) in (_number, _integer)


def parse_tune(value: Any) -> tuple[TuneSpec | None, list[tuple[str, str]]]:
    """(the tune section, its problems as (field under ``tune``, message)), all at once."""
    if not isinstance(value, Mapping):
        return None, [("", "expected a mapping with iterations and space")]
    problems: list[tuple[str, str]] = []
    for key in sorted(set(value) - {"iterations", "space"}, key=str):
        problems.append((str(key), "unknown field (allowed: iterations, space)"))
    iterations = value.get("iterations")
    if not _integer(iterations) or not 1 <= iterations <= MAX_TUNE_ITERATIONS:
        problems.append(("iterations", f"expected an integer from 1 to {MAX_TUNE_ITERATIONS}, got {iterations!r}"))
    space = value.get("space")
    bounds: dict[str, tuple[float, ...]] | None = None
    if space is not None:
        if not isinstance(space, Mapping) or not space:
            problems.append(("space", "expected a mapping of argument: [low, high] or [low, high, gain]"))
        else:
            bounds = {}
            for key, item in space.items():
                problem = _space_problem(str(key), item)
                if problem:
                    problems.append((f"space.{key}", problem))
                else:
                    bounds[str(key)] = tuple(item)
    if problems:
        return None, problems
    return TuneSpec(iterations=iterations, space=bounds), []


def tune_schema() -> dict[str, Any]:
    """parse_tune's rules as a JSON Schema object (the API's job spec schema); low <= high, the
    gain's range and an integer argument's bounds holding an integer are checked in code only."""
    bounds = {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 3,
              "description": "[low, high] or [low, high, gain]; gain from 0 to 1"}
    space = {"type": "object", "minProperties": 1, "additionalProperties": False,
             "properties": {name: bounds for name in sorted(EXTRA_ARGS) if tunable(name)},
             "description": "Left out: Ultralytics' own space, less what the allowlist refuses."}
    return {"type": "object", "additionalProperties": False, "required": ["iterations"], "properties": {
        "iterations": {"type": "integer", "minimum": 1, "maximum": MAX_TUNE_ITERATIONS}, "space": space}}


def _space_problem(key: str, item: Any) -> str | None:
    if not tunable(key):
        names = ", ".join(sorted(name for name in EXTRA_ARGS if tunable(name)))
        return f"not a numeric training argument that may be tuned (allowed: {names})"
    if not isinstance(item, list | tuple) or len(item) not in (2, 3) or not all(_number(v) for v in item):
        return f"expected [low, high] or [low, high, gain] (numbers), got {item!r}"
    if item[0] > item[1]:
        return f"low {item[0]!r} is above high {item[1]!r}"
    if len(item) == 3 and not 0 <= item[2] <= 1:
        return f"gain must be from 0 to 1, got {item[2]!r}"
    if EXTRA_ARGS[key] is _integer and math.ceil(item[0]) > math.floor(item[1]):
        return f"{key} takes integers, and [{item[0]}, {item[1]}] holds none"
    return None


_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_WEIGHTS_SUFFIXES = (".pt", ".pth")
_YAML_SUFFIXES = (".yaml", ".yml")
PARTIAL_EPOCH_MODES = ("redo", "skip")
EXPORT_FORMATS = ("onnx", "torchscript", "openvino", "engine")

_REQUIRED = ("run_id", "model", "data", "epochs", "imgsz", "batch", "device", "output_dir")
_OPTIONAL = (
    "workers",
    "resume_from",
    "must_end_by",
    "grace_s",
    "report_url",
    "report_token",
    "partial_epoch",
    "export",
    "extra",
    "allow_gpu_count_change",
    "tune",
)


@dataclass(frozen=True)
class RunSpec:
    """One validated run. Build it with :func:`parse_spec` / :func:`load_spec`."""

    run_id: str
    model: str  # a built-in model YAML name, or an absolute path (model YAML or weights)
    data: Path
    epochs: int
    imgsz: int
    batch: int
    device: tuple[int, ...] | str  # one CUDA index, or "cpu"
    output_dir: Path
    workers: int = 2
    resume_from: Path | None = None
    must_end_by: datetime | None = None  # aware, UTC
    grace_s: float = 60.0
    report_url: str | None = None
    report_token: str | None = field(default=None, repr=False)
    partial_epoch: str = "redo"
    export: tuple[str, ...] = ("onnx",)
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    allow_gpu_count_change: bool = False
    tune: TuneSpec | None = None

    @property
    def gpu_count(self) -> int:
        """0 on the CPU; DDP when more than 1."""
        return 0 if self.device == "cpu" else len(self.device)

    @property
    def model_is_weights(self) -> bool:
        return self.model.endswith(_WEIGHTS_SUFFIXES)

    @property
    def ultralytics_device(self) -> str:
        """The device string Ultralytics takes: ``"cpu"`` or ``"0,1"``."""
        return self.device if isinstance(self.device, str) else ",".join(map(str, self.device))

    def stop_at(self) -> float | None:
        """Wall-clock time (epoch seconds) at which the runner stops itself, if any."""
        if self.must_end_by is None:
            return None
        return self.must_end_by.timestamp() - self.grace_s


def load_spec(path: str | Path) -> RunSpec:
    """Read and validate a spec file. Raises :class:`SpecError`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError("", f"spec file not found: {path}") from None
    except OSError as exc:
        raise SpecError("", f"cannot read spec file {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError("", f"{path} is not valid JSON: {exc}") from None
    return parse_spec(data)


def parse_spec(data: Any, *, cwd: Path | None = None) -> RunSpec:
    """Validate a decoded spec (a dict). Raises :class:`SpecError` naming the first bad field."""
    if not isinstance(data, dict):
        raise SpecError("", "the spec must be a JSON object")
    cwd = (cwd or Path.cwd()).resolve()
    unknown = sorted(set(data) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise SpecError(unknown[0], f"unknown field (allowed: {', '.join(_REQUIRED + _OPTIONAL)})")
    for name in _REQUIRED:
        if data.get(name) is None:
            raise SpecError(name, "missing (required)")

    kwargs: dict[str, Any] = {
        "run_id": _run_id(data["run_id"]),
        "model": _model(data["model"], cwd),
        "data": _existing_file("data", data["data"], cwd, _YAML_SUFFIXES, "a data YAML (.yaml/.yml)"),
        "epochs": _int_in("epochs", data["epochs"], 1, 100_000),
        "imgsz": _int_in("imgsz", data["imgsz"], 32, 8192),
        "batch": _batch(data["batch"]),
        "device": _device(data["device"]),
        "output_dir": _output_dir(data["output_dir"], cwd),
    }
    if data.get("workers") is not None:
        kwargs["workers"] = _int_in("workers", data["workers"], 0, 64)
    if data.get("resume_from") is not None:
        kwargs["resume_from"] = _existing_file(
            "resume_from", data["resume_from"], cwd, _WEIGHTS_SUFFIXES, "a checkpoint (.pt)"
        )
    if data.get("must_end_by") is not None:
        kwargs["must_end_by"] = _utc_datetime("must_end_by", data["must_end_by"])
    if data.get("grace_s") is not None:
        if not _number(data["grace_s"]) or data["grace_s"] < 0:
            raise SpecError("grace_s", f"must be a number of seconds >= 0, got {data['grace_s']!r}")
        kwargs["grace_s"] = float(data["grace_s"])
    url, token = data.get("report_url"), data.get("report_token")
    if url is not None:
        kwargs["report_url"] = _url(url)
        if not isinstance(token, str) or not token:
            raise SpecError("report_token", "required (a non-empty string) when report_url is set")
        kwargs["report_token"] = token
    elif token is not None:
        raise SpecError("report_token", "given without report_url")
    if data.get("partial_epoch") is not None:
        if data["partial_epoch"] not in PARTIAL_EPOCH_MODES:
            raise SpecError(
                "partial_epoch",
                f"must be one of {', '.join(PARTIAL_EPOCH_MODES)}, got {data['partial_epoch']!r}",
            )
        kwargs["partial_epoch"] = data["partial_epoch"]
    if data.get("export") is not None:
        kwargs["export"] = _export(data["export"])
    if data.get("extra") is not None:
        kwargs["extra"] = _extra(data["extra"])
    if data.get("allow_gpu_count_change") is not None:
        if not _boolean(data["allow_gpu_count_change"]):
            raise SpecError("allow_gpu_count_change", f"must be true or false, got {data['allow_gpu_count_change']!r}")
        kwargs["allow_gpu_count_change"] = data["allow_gpu_count_change"]
    if data.get("tune") is not None:
        kwargs["tune"] = _tune(data["tune"], kwargs)
    return RunSpec(**kwargs)


# --- field validators ------------------------------------------------------------------------


def _run_id(value: Any) -> str:
    if _integer(value) and value >= 0:
        value = str(value)
    if not isinstance(value, str) or not _RUN_ID.match(value):
        raise SpecError("run_id", f"must be a string of letters, digits, '.', '_' or '-' (<=128), got {value!r}")
    return value


def _int_in(name: str, value: Any, low: int, high: int) -> int:
    if not _integer(value) or not low <= value <= high:
        raise SpecError(name, f"must be an integer from {low} to {high}, got {value!r}")
    return value


def _batch(value: Any) -> int:
    if not _integer(value) or not (value == -1 or 1 <= value <= 65536):
        raise SpecError("batch", f"must be an integer >= 1, or -1 for AutoBatch, got {value!r}")
    return value


def _device(value: Any) -> tuple[int, ...] | str:
    if value == "cpu":
        return "cpu"
    if (
        isinstance(value, list)
        and value
        and all(_integer(v) and 0 <= v < 1024 for v in value)
        and len(set(value)) == len(value)
    ):
        # Several GPUs: the runner launches one DDP worker per GPU itself (ddp.py).
        return tuple(value)
    raise SpecError("device", f'must be "cpu" or a non-empty list of distinct GPU indices, got {value!r}')


def _path(name: str, value: Any, cwd: Path) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise SpecError(name, f"must be a path string, got {value!r}")
    if "://" in value:
        raise SpecError(name, f"must be a local path (no downloads at run time), got {value!r}")
    path = Path(value).expanduser()
    return path if path.is_absolute() else cwd / path


def _existing_file(name: str, value: Any, cwd: Path, suffixes: tuple[str, ...], what: str) -> Path:
    path = _path(name, value, cwd)
    if not path.name.lower().endswith(suffixes):
        raise SpecError(name, f"must be {what}, got {value!r}")
    if not path.is_file():
        raise SpecError(name, f"file not found: {path}")
    return path


def _model(value: Any, cwd: Path) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SpecError("model", f"must be a model YAML name/path or a weights path, got {value!r}")
    lower = value.lower()
    if lower.endswith(_WEIGHTS_SUFFIXES):
        path = _path("model", value, cwd)
        if not path.is_file():
            raise SpecError(
                "model",
                f"weights file not found: {path} (weights must come from a mounted volume; "
                "the runner downloads nothing)",
            )
        return str(path)
    if not lower.endswith(_YAML_SUFFIXES):
        raise SpecError("model", f"must end in .yaml/.yml (a model config) or .pt (weights), got {value!r}")
    if "/" in value or "\\" in value or (cwd / value).is_file():
        path = _path("model", value, cwd)
        if not path.is_file():
            raise SpecError("model", f"model YAML not found: {path}")
        return str(path)
    if builtin_model_yaml_exists(value) is False:
        raise SpecError("model", f"{value!r} is not a model config that ships with Ultralytics (e.g. yolov8n.yaml)")
    return value


def builtin_model_yaml_exists(name: str) -> bool | None:
    """Whether Ultralytics ships a model config for ``name`` (``yolov8n.yaml`` → ``yolov8.yaml``).

    Looks at the installed package's files without importing it (no torch needed). Returns
    None when Ultralytics is not installed, so the check is left to the run.
    """
    found = importlib.util.find_spec("ultralytics")
    if found is None or not found.submodule_search_locations:
        return None
    models = Path(next(iter(found.submodule_search_locations))) / "cfg" / "models"
    stem, suffix = Path(name).stem, Path(name).suffix
    candidates = {
        name,
        # the same renames Ultralytics applies (nn/tasks.py yaml_model_load)
        re.sub(r"(\d+)([nslmx])6(.+)?$", r"\1\2-p6\3", stem) + suffix,
        re.sub(r"(\d+)([nslmx])(.+)?$", r"\1\3", stem) + suffix,
        re.sub(r"(\d+)([nslmx])(.+)?$", r"\1\3", re.sub(r"(\d+)([nslmx])6(.+)?$", r"\1\2-p6\3", stem)) + suffix,
    }
    return any(next(models.rglob(c), None) is not None for c in candidates)


def _output_dir(value: Any, cwd: Path) -> Path:
    path = _path("output_dir", value, cwd)
    if path.exists() and not path.is_dir():
        raise SpecError("output_dir", f"exists and is not a directory: {path}")
    return path


def _utc_datetime(name: str, value: Any) -> datetime:
    if not isinstance(value, str):
        raise SpecError(name, f"must be an ISO-8601 string with a zone, got {value!r}")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise SpecError(name, f"not an ISO-8601 date-time: {value!r}") from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise SpecError(name, f"must include a zone (e.g. 'Z' or '+00:00'), got {value!r}")
    return moment.astimezone(UTC)


def _url(value: Any) -> str:
    if not isinstance(value, str):
        raise SpecError("report_url", f"must be an http(s) URL, got {value!r}")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SpecError("report_url", f"must be an http(s) URL, got {value!r}")
    return value


def _export(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(v in EXPORT_FORMATS for v in value):
        raise SpecError("export", f"must be a list drawn from {', '.join(EXPORT_FORMATS)}")
    return tuple(dict.fromkeys(value))


def _tune(value: Any, fields: dict[str, Any]) -> TuneSpec:
    tune, problems = parse_tune(value)
    if problems:
        name, problem = problems[0]
        raise SpecError(f"tune.{name}" if name else "tune", problem)
    if fields["device"] != "cpu" and len(fields["device"]) > 1:
        raise SpecError("device", "a tune run trains its iterations on one GPU (or the CPU)")
    if fields.get("resume_from") is not None:
        raise SpecError("resume_from", "a tune run continues from its own output_dir (tune/tune_results.ndjson)")
    if fields.get("export"):
        raise SpecError("export", "a tune run exports nothing: train the best hyper-parameters as a job of its own")
    fields["export"] = ()
    return tune


def _extra(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise SpecError("extra", "must be an object of extra Ultralytics train arguments")
    for key, item in value.items():
        check = EXTRA_ARGS.get(key)
        if check is None:
            raise SpecError(
                f"extra.{key}",
                "not an allowed training argument (allowed: " + ", ".join(sorted(EXTRA_ARGS)) + ")",
            )
        if not check(item):
            raise SpecError(f"extra.{key}", f"must be {check.__doc__}, got {item!r}")
    return MappingProxyType(dict(value))
