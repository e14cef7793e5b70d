"""Job specs in the shape teams already use, validated strictly. Pure: no Django.

    task_name: detector-v3
    image: yolo:v8n-cu118
    yolo: {model: yolov8n.yaml, data: /data/vision/shapes/data.yaml, epochs: 30, imgsz: 640, batch: 16,
           extra: {lr0: 0.01}, export: [onnx, torchscript]}
    # epochs, imgsz and extra default to the image's default_hyperparameters; batch, when
    # left out, comes from the image's table for the booked GPU's memory (resolve_yolo);
    # export: any of onnx, torchscript, engine (TensorRT: NVIDIA GPUs only), openvino
    # or, instead of yolo:   command: ["python", "train.py", "--fast"]   (an argv list, never a string)
    tune: {iterations: 30, space: {lr0: [0.00001, 0.1], momentum: [0.6, 0.98, 0.3]}}
                                # with yolo: hyper-parameter tuning instead of one training; yolo's
                                # epochs are per iteration; space defaults to Ultralytics' own
                                # (training/runner/tune.py); one GPU, no export
    resources: {gpu: 2, memory: 32Gi, cpu: 8}
    priority: medium            # low | medium | high | urgent
    team: vision
    timeout: 4h                 # seconds, or a number with s/m/h/d
    estimated_duration: 90m
    checkpointable: true        # default true for yolo jobs, false for commands
    then: next_booking          # when a slot ends before the job: next_booking | backfill | hold
                                # (default next_booking for a job submitted into a booking, else backfill)
    then_team: false            # next_booking may also take a teammate's booking

Every problem is reported with the field it concerns, all at once, so a person can fix the
whole file in one go.
"""

import dataclasses
import json
import os
import re
import shlex
from collections.abc import Callable, Mapping
from typing import Any

from scheduler import Priority
from training import safe_yaml
from training.runner.spec import EXPORT_FORMATS, EXTRA_ARGS, TuneSpec, extra_args_schema, parse_tune, tune_schema

TOP_LEVEL = {
    "task_name", "image", "command", "yolo", "resources", "priority", "team", "timeout",
    "estimated_duration", "checkpointable", "then", "then_team", "tune",
}
YOLO_KEYS = {"model", "data", "epochs", "imgsz", "batch", "extra", "export", "allow_gpu_count_change"}
DEFAULT_EXPORT = ("onnx",)
RESOURCE_KEYS = {"gpu", "memory", "cpu"}
PRIORITIES = tuple(priority.value for priority in Priority)  # defined once, in the scheduling core
# What a job does when its slot ends before it does (DESIGN.md "TrainingJob").
THEN_CHOICES = ("next_booking", "backfill", "hold")
BUILTIN_MODEL = re.compile(r"^yolo[a-z0-9]*[nsmlx]?(-[a-z]+)?\.yaml$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T|m)?$")
DURATION = re.compile(r"^([0-9]+)\s*([smhd]?)$")
UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
# What the duration columns (TrainingJob.timeout_s, estimated_duration_s) hold: some 68 years.
MAX_DURATION_S = 2**31 - 1


class JobSpecError(ValueError):
    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{field}: {message}" for field, message in problems))


@dataclasses.dataclass(frozen=True)
class YoloTask:
    model: str
    data: str
    # None where the spec leaves a field out: the image's default (else the built-in one) fills
    # it when a run starts (resolve_yolo), and batch comes from the table for the GPU it gets.
    epochs: int | None
    imgsz: int | None
    batch: int | None
    extra: Mapping[str, Any]
    export: tuple[str, ...] | None = None
    allow_gpu_count_change: bool = False  # resume a checkpoint trained on another number of GPUs


@dataclasses.dataclass(frozen=True)
class JobSpec:
    task_name: str
    image: str
    team: str
    gpus: int
    priority: str
    checkpointable: bool
    yolo: YoloTask | None = None
    command: tuple[str, ...] = ()
    memory: str | None = None
    cpu: str | None = None
    timeout_s: int | None = None
    estimated_duration_s: int | None = None
    then: str | None = None  # None: decided at submit (next_booking in a booking, else backfill)
    then_team: bool = False
    tune: TuneSpec | None = None  # hyper-parameter tuning of the yolo section (issue #17)

    def as_dict(self) -> dict[str, Any]:
        """The normalized spec (defaults filled in), JSON-safe: stored on the job at submit and
        the only thing launch reads, so no default is restated anywhere else."""
        data = dataclasses.asdict(self)
        data["command"] = list(self.command)
        if self.yolo is not None:
            data["yolo"]["extra"] = dict(self.yolo.extra)
            data["yolo"]["export"] = list(self.yolo.export) if self.yolo.export is not None else None
        data["tune"] = self.tune.as_json() if self.tune is not None else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JobSpec":
        fields = {field.name for field in dataclasses.fields(cls)}
        values = {key: value for key, value in data.items() if key in fields}
        yolo = dict(values.get("yolo") or {})
        if yolo.get("export") is not None:
            yolo["export"] = tuple(yolo["export"])
        values["yolo"] = YoloTask(**yolo) if yolo else None
        values["command"] = tuple(values.get("command") or ())
        tune = values.get("tune")
        if tune:
            space = tune.get("space")
            values["tune"] = TuneSpec(iterations=tune["iterations"],
                                      space={key: tuple(bounds) for key, bounds in space.items()} if space else None)
        return cls(**values)


def load_document(text: str) -> Any:
    """YAML (which includes JSON). A syntax error is a spec problem, not a crash."""
    try:
        return safe_yaml.load(text)
    except safe_yaml.UnsafeYamlError as error:
        raise JobSpecError([("", str(error))]) from error


def _duration(value: Any, field: str, problems: list) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        seconds = value
    else:
        match = DURATION.match(str(value).strip()) if isinstance(value, str) else None
        if match is None or int(match.group(1)) <= 0:
            problems.append((field, f"expected seconds or a number with s/m/h/d (e.g. 90m), got {value!r}"))
            return None
        seconds = int(match.group(1)) * UNIT_SECONDS[match.group(2)]
    if seconds > MAX_DURATION_S:
        problems.append((field, f"at most {MAX_DURATION_S} seconds, got {value!r}"))
        return None
    return seconds


def _positive_int(value: Any, field: str, problems: list, *, minimum: int = 1, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum and value > maximum):
        bound = f" and at most {maximum}" if maximum else ""
        problems.append((field, f"expected an integer at least {minimum}{bound}, got {value!r}"))
        return minimum
    return value


def _under_roots(path: str, roots: list[str]) -> bool:
    """True if `path` (absolute, normalized, no '..' escape) lies inside one of `roots`."""
    if not os.path.isabs(path):
        return False
    normal = os.path.normpath(path)
    return any(os.path.commonpath([normal, os.path.normpath(root)]) == os.path.normpath(root) for root in roots)


def require_mapping(document: Any) -> None:
    """A spec is a mapping of fields (a one-word `spec_yaml` parses to a string)."""
    if not isinstance(document, Mapping):
        raise JobSpecError([("", "the spec must be a mapping of fields")])


def parse_job_spec(
    document: Any, *, allowed_images: set[str], data_roots: list[str], max_gpus: int
) -> JobSpec:
    """Validate a job spec. `data_roots` are the directories this team may read data and
    weights from; `max_gpus` is the largest node's GPU count (a job runs on one node)."""
    problems: list[tuple[str, str]] = []
    require_mapping(document)
    for key in sorted(set(document) - TOP_LEVEL, key=str):
        problems.append((str(key), "unknown field"))

    task_name = document.get("task_name")
    if not isinstance(task_name, str) or not task_name.strip() or len(task_name) > 200:
        problems.append(("task_name", "required: a name of at most 200 characters"))
    image = document.get("image")
    if not isinstance(image, str) or image not in allowed_images:
        problems.append(("image", f"{image!r} is not an allowed image; allowed: {', '.join(sorted(allowed_images))}"))
    team = document.get("team")
    if not isinstance(team, str) or not team:
        problems.append(("team", "required: the team's slug"))
    priority = document.get("priority", "medium")
    if priority not in PRIORITIES:
        problems.append(("priority", f"expected one of {', '.join(PRIORITIES)}, got {priority!r}"))

    resources = document.get("resources", {}) or {}
    gpus, memory, cpu = 1, None, None
    if not isinstance(resources, Mapping):
        problems.append(("resources", "expected a mapping with gpu, memory, cpu"))
    else:
        for key in sorted(set(resources) - RESOURCE_KEYS, key=str):
            problems.append((f"resources.{key}", "unknown field"))
        gpus = _positive_int(resources.get("gpu", 1), "resources.gpu", problems, maximum=max_gpus)
        if isinstance(resources.get("gpu"), int) and resources["gpu"] > max_gpus:
            problems[-1] = ("resources.gpu", f"a job runs on one node, and the largest has {max_gpus} GPUs")
        for name in ("memory", "cpu"):
            value = resources.get(name)
            if value is None:
                continue
            if not QUANTITY.match(str(value)):
                problems.append((f"resources.{name}", f"expected a Kubernetes quantity like 32Gi or 8, got {value!r}"))
            elif name == "memory":
                memory = str(value)
            else:
                cpu = str(value)

    command = document.get("command")
    yolo = document.get("yolo")
    yolo_task = None
    argv: tuple[str, ...] = ()
    if (command is None) == (yolo is None):
        problems.append(("command", "give exactly one of `command` (an argv list) or `yolo`"))
    elif command is not None:
        if isinstance(command, str):
            problems.append(("command", "must be a list of arguments, never a shell string (no shell runs it): "
                                        f"write command: {argv_form(command)}, or `yolo train key=value …`"))
        elif not isinstance(command, list) or not command or not all(isinstance(arg, str) for arg in command):
            problems.append(("command", "expected a non-empty list of strings"))
        else:
            argv = tuple(command)
    else:
        # Several GPUs of one node: the runner launches one DDP worker per GPU (runner/ddp.py).
        yolo_task = _parse_yolo(yolo, data_roots, problems)

    tune = None
    if document.get("tune") is not None:
        tune = _parse_tune(document["tune"], yolo=yolo, gpus=gpus, problems=problems)

    timeout_s = _duration(document.get("timeout"), "timeout", problems)
    estimate_s = _duration(document.get("estimated_duration"), "estimated_duration", problems)
    checkpointable = document.get("checkpointable", yolo is not None)
    if not isinstance(checkpointable, bool):
        problems.append(("checkpointable", "expected true or false"))
    then = document.get("then")
    if then is not None and then not in THEN_CHOICES:
        problems.append(("then", f"expected one of {', '.join(THEN_CHOICES)}, got {then!r}"))
    then_team = document.get("then_team", False)
    if not isinstance(then_team, bool):
        problems.append(("then_team", "expected true or false"))
    if problems:
        raise JobSpecError(problems)
    return JobSpec(
        task_name=task_name.strip(), image=image, team=team, gpus=gpus, priority=priority,
        checkpointable=checkpointable, yolo=yolo_task, command=argv, memory=memory, cpu=cpu,
        timeout_s=timeout_s, estimated_duration_s=estimate_s, then=then, then_team=then_team, tune=tune,
    )


def _parse_tune(tune: Any, *, yolo: Any, gpus: int, problems: list) -> TuneSpec | None:
    """The runner's own tune validator (runner/spec.parse_tune), and what only a job can get wrong."""
    parsed, found = parse_tune(tune)
    problems.extend((f"tune.{field}" if field else "tune", message) for field, message in found)
    if not isinstance(yolo, Mapping):
        problems.append(("tune", "tunes a `yolo` section: give yolo (model, data, epochs per iteration) with it"))
    elif yolo.get("export"):
        problems.append(("yolo.export", "a tune job exports nothing: export from the job its best values make"))
    if gpus > 1:
        problems.append(("resources.gpu", "a tune job trains its iterations on one GPU"))
    return parsed


def _parse_yolo(yolo: Any, data_roots: list[str], problems: list) -> YoloTask | None:
    if not isinstance(yolo, Mapping):
        problems.append(("yolo", "expected a mapping with model, data, epochs, imgsz, batch, extra"))
        return None
    for key in sorted(set(yolo) - YOLO_KEYS, key=str):
        problems.append((f"yolo.{key}", "unknown field"))
    model = yolo.get("model")
    if not isinstance(model, str) or not (BUILTIN_MODEL.match(model) or _under_roots(model, data_roots)):
        problems.append(("yolo.model", f"expected a model YAML name (e.g. yolov8n.yaml) or a weights file under "
                                       f"your data roots ({', '.join(data_roots)}), got {model!r}"))
    data = yolo.get("data")
    if not isinstance(data, str) or not _under_roots(data, data_roots):
        problems.append(("yolo.data", f"{data!r} is outside your team's data roots ({', '.join(data_roots)})"))
    epochs = yolo.get("epochs")
    if epochs is not None:
        epochs = _positive_int(epochs, "yolo.epochs", problems, maximum=10_000)
    imgsz = yolo.get("imgsz")
    if imgsz is not None:
        imgsz = _positive_int(imgsz, "yolo.imgsz", problems, minimum=32, maximum=8192)
    batch = yolo.get("batch")
    if batch is not None and batch != -1:
        batch = _positive_int(batch, "yolo.batch", problems, maximum=4096)
    export = yolo.get("export")
    if export is not None and (
        not isinstance(export, list) or not all(isinstance(v, str) and v in EXPORT_FORMATS for v in export)
    ):
        problems.append(("yolo.export", f"expected a list drawn from {', '.join(EXPORT_FORMATS)} "
                                        f"(or [] for none), got {export!r}"))
        export = list(DEFAULT_EXPORT)
    allow_gpu_count_change = yolo.get("allow_gpu_count_change", False)
    if not isinstance(allow_gpu_count_change, bool):
        problems.append(("yolo.allow_gpu_count_change", "expected true or false (resume on another number of GPUs)"))
    extra = yolo.get("extra", {}) or {}
    if not isinstance(extra, Mapping):
        problems.append(("yolo.extra", "expected a mapping of Ultralytics train arguments"))
        extra = {}
    for key, value in extra.items():
        check = EXTRA_ARGS.get(key)
        if check is None:
            problems.append((f"yolo.extra.{key}", "not an allowed Ultralytics argument"))
        elif not check(value):
            problems.append((f"yolo.extra.{key}", f"{value!r} is not a valid value"))
    return YoloTask(model=str(model), data=str(data), epochs=epochs, imgsz=imgsz, batch=batch, extra=dict(extra),
                    export=tuple(dict.fromkeys(export)) if export is not None else None,
                    allow_gpu_count_change=allow_gpu_count_change is True)


def _regex_literal(text: str) -> str:
    """`text` as an ECMA-262 pattern (re.escape also escapes `-`, which is not valid there)."""
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", text)


def json_schema(
    *, images: list[str], max_gpus: int, data_roots: list[str], teams: list[str] | None = None
) -> dict[str, Any]:
    """What parse_job_spec (after normalize_seed_style) accepts, as an OpenAPI 3.0 schema for
    the API's `spec` object. `images` and `max_gpus` are the server's catalog and inventory,
    `data_roots` the configured roots ("{team}": a team's slug) and `teams` the slugs of the
    teams the caller may submit for (None: no caller), when the schema is served. Rules about
    two fields together are left to the words: a path under the named team's roots (not another
    team's), a tune's companions (yolo, no export, one GPU), a seed-style command's arguments."""
    nullable = {"nullable": True}
    slug = {"type": "string", "minLength": 1, **({"enum": sorted(teams)} if teams else {})}
    any_team = "(" + "|".join(_regex_literal(team) for team in sorted(teams)) + ")" if teams else "[^/]+"
    under_roots = {"pattern": "^(" + "|".join(
        _regex_literal(os.path.normpath(root)).replace(_regex_literal("{team}"), any_team) for root in data_roots
    ) + ")(/|$)"}
    duration = {"nullable": True, "anyOf": [
        {"type": "integer", "minimum": 1, "maximum": MAX_DURATION_S},
        {"type": "string", "pattern": r"^\s*0*[1-9][0-9]*\s*[smhd]?\s*$"},
    ], "description": f"Seconds, or a number with s, m, h or d (e.g. 90m); at most {MAX_DURATION_S} seconds."}
    quantity = {"nullable": True, "anyOf": [{"type": "string", "pattern": QUANTITY.pattern},
                                            {"type": "integer", "minimum": 0}],
                "description": "A Kubernetes quantity, e.g. 32Gi or 8."}
    yolo = {"type": "object", "additionalProperties": False, "required": ["model", "data"], "properties": {
        "model": {"type": "string", "anyOf": [{"pattern": BUILTIN_MODEL.pattern}, {"pattern": r"^[^/].*\.pt$"},
                                              under_roots],
                  "description": "A model YAML name (e.g. yolov8n.yaml), or a weights file under the team's "
                                 "data roots (a relative .pt: under its own)."},
        "data": {"type": "string", "anyOf": [{"pattern": "^[^/]"}, under_roots],
                 "description": "The data YAML, under the team's data roots (relative: under its own)."},
        "epochs": {"type": "integer", "minimum": 1, "maximum": 10_000, **nullable},
        "imgsz": {"type": "integer", "minimum": 32, "maximum": 8192, **nullable},
        "batch": {"type": "integer", "minimum": -1, "maximum": 4096, "not": {"enum": [0]}, **nullable,
                  "description": "-1: Ultralytics' AutoBatch; left out: the image's table for the GPU."},
        "extra": {**extra_args_schema(), **nullable, "description": "Ultralytics train arguments (allowlisted)."},
        "export": {"type": "array", "items": {"type": "string", "enum": list(EXPORT_FORMATS)}, **nullable},
        "allow_gpu_count_change": {"type": "boolean"},
    }}
    resources = {"type": "object", "additionalProperties": False, **nullable, "properties": {
        "gpu": {"type": "integer", "minimum": 1, **({"maximum": max_gpus} if max_gpus else {}),
                "description": "GPUs of one node: at most the largest node's count."},
        "memory": quantity, "cpu": quantity,
    }}
    command = {"anyOf": [
        {"type": "array", "items": {"type": "string"}, "minItems": 1, "description": "An argv list (no shell)."},
        {"type": "string", "pattern": r"^[ \t\r\n]*yolo[ \t\r\n]+train([ \t\r\n]|$)",  # shlex's blanks
         "description": "Seed style: `yolo train key=value …`, read into `yolo`."},
    ]}
    properties = {
        "task_name": {"type": "string", "pattern": r"\S", "maxLength": 200},
        "image": {"type": "string", **({"enum": sorted(images)} if images else {}),
                  "description": "An allowed image of the catalog."},
        "team": {**slug, "description": "The team's slug."},
        "user": {**slug, "description": "Seed style: the team's slug, if `team` is not given."},
        "command": command, "yolo": yolo, "resources": resources,
        "priority": {"type": "string", "enum": list(PRIORITIES)},
        "timeout": duration, "estimated_duration": duration,
        "checkpointable": {"type": "boolean", "description": "Default: true for yolo jobs, false for commands."},
        "then": {"type": "string", "enum": list(THEN_CHOICES), **nullable},
        "then_team": {"type": "boolean"},
        "tune": {**tune_schema(), **nullable},
    }
    return {
        "type": "object", "additionalProperties": False, "properties": properties,
        "required": ["task_name", "image"],
        # exactly one of the two ways to train, and of the two ways to name the team (seed style
        # keeps `user` beside `team` only when both name the same team: not worth a schema)
        "oneOf": [{"required": ["command"]}, {"required": ["yolo"]}],
        "anyOf": [{"required": ["team"]}, {"required": ["user"]}],
        "not": {"required": ["team", "user"]},
    }


# --- seed-style job files -------------------------------------------------------------------
# Teams arrive with files written for the Ultralytics command line:
#     command: "yolo train data=pcb_defect.yaml model=yolov8s.pt epochs=100 imgsz=640"
#     user: team-a
# They are rewritten here into the strict shape above and then validated by parse_job_spec
# like any other spec, so both forms obey exactly the same rules.

YOLO_TRAIN_PREFIX = ("yolo", "train")


def _cli_value(text: str) -> Any:
    """A value from `key=value` read as Ultralytics' own command line reads it: numbers,
    booleans and none become typed; everything else stays a string."""
    lowered = text.lower()
    if lowered in {"true", "false"}:
        return lowered == "true"
    if lowered == "none":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _yolo_from_command(argv: list[str]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    yolo: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    problems: list[tuple[str, str]] = []
    for token in argv[len(YOLO_TRAIN_PREFIX):]:
        key, equals, text = token.partition("=")
        if not equals or not key:
            problems.append(("command", f"{token!r}: expected key=value after `yolo train`"))
            continue
        target = yolo if key in YOLO_KEYS - {"extra"} else extra
        if key in target or key == "extra":
            problems.append(("command", f"{key!r} is given twice" if key != "extra" else "'extra' is not an argument"))
            continue
        # Paths stay strings even when they look like numbers.
        target[key] = text if key in {"model", "data"} else _cli_value(text)
    if extra:
        yolo["extra"] = extra
    return yolo, problems


def _resolve_relative(path: Any, root: str | None) -> Any:
    if not isinstance(path, str) or not path or os.path.isabs(path) or root is None:
        return path
    return os.path.normpath(os.path.join(root, path))  # a '..' escape is then refused by _under_roots


def normalize_seed_style(
    document: Any, *, is_team: Callable[[str], bool], data_root_of: Callable[[str], str | None]
) -> Any:
    """Rewrite the seed-style fields of a spec into the strict form; anything else unchanged.

    - `command: "yolo train k=v …"` (split like a shell would, but no shell runs) becomes `yolo:`;
      model/data/epochs/imgsz/batch are its fields, every other key goes to `extra`, where the
      allowlist then judges it.
    - `user: <slug>` names the team when it is a team and no `team:` is given.
    - a relative `yolo.data` (and a relative `.pt` weights file, since weights also come from the
      mounted data volume) resolves under the team's data root.
    Problems it cannot rewrite (an unbalanced quote, a token that is not key=value) raise
    JobSpecError naming `command`."""
    if not isinstance(document, Mapping):
        return document
    spec = dict(document)
    user = spec.get("user")
    if isinstance(user, str) and is_team(user) and spec.get("team") in (None, user):
        spec.pop("user")
        spec["team"] = user
    command = spec.get("command")
    if isinstance(command, str) and "yolo" not in spec:
        try:
            argv = shlex.split(command)
        except ValueError as error:
            raise JobSpecError([("command", f"cannot split {command!r}: {error}")]) from None
        if tuple(argv[: len(YOLO_TRAIN_PREFIX)]) == YOLO_TRAIN_PREFIX:
            yolo, problems = _yolo_from_command(argv)
            if problems:
                raise JobSpecError(problems)
            spec.pop("command")
            spec["yolo"] = yolo
    yolo = spec.get("yolo")
    team = spec.get("team")
    if isinstance(yolo, Mapping) and isinstance(team, str) and team:
        root = data_root_of(team)
        yolo = dict(yolo)
        yolo["data"] = _resolve_relative(yolo.get("data"), root)
        model = yolo.get("model")
        if isinstance(model, str) and model.endswith(".pt"):
            yolo["model"] = _resolve_relative(model, root)
        spec["yolo"] = yolo
    return spec


def argv_form(command: str) -> str:
    """How a command string is written as an argv list, for the refusal message."""
    try:
        argv = shlex.split(command)
    except ValueError:
        argv = command.split()
    return json.dumps(argv)


# --- image defaults and batch advice -------------------------------------------------------------
# An image's default_hyperparameters fill what a spec leaves out (epochs, imgsz, batch, and
# any allowlisted extra argument); its recommended_batch table ({"<GPU MiB at least>": batch})
# gives the batch when the spec has none. Pure, so the submit form, the API, the CLI and the
# run's start all say the same thing.

BUILTIN_DEFAULTS = {"epochs": 10, "imgsz": 640}
FALLBACK_BATCH = 16  # no table entry fits (or the GPU is unknown): Ultralytics' own default
DEFAULT_SAVE_PERIOD = 10  # epochs between weights/epochN.pt; an image may set its own


@dataclasses.dataclass(frozen=True)
class ResolvedYolo:
    epochs: int
    imgsz: int
    batch: int
    extra: Mapping[str, Any]
    export: tuple[str, ...]
    batch_source: str  # "spec", "image default", "table" or "fallback"
    advice: str | None  # "batch 16 for a 24 GB GPU with this model"
    warnings: tuple[str, ...] = ()


def batch_from_table(table: Mapping[str, Any], memory_mib: int | None) -> int | None:
    """The batch of the largest table entry not above ``memory_mib`` (None if none fits)."""
    if memory_mib is None:
        return None
    fitting = []
    for limit, batch in (table or {}).items():
        try:
            if int(limit) <= memory_mib and isinstance(batch, int) and batch > 0:
                fitting.append((int(limit), batch))
        except (TypeError, ValueError):
            continue  # an admin's typo in one row must not break every submit
    return max(fitting)[1] if fitting else None


def gpu_size_words(memory_mib: int) -> str:
    """24564 MiB -> "24 GB": what a person calls the card."""
    return f"{max(1, round(memory_mib / 1024))} GB"


def resolve_yolo(
    yolo: Mapping[str, Any],
    *,
    image_defaults: Mapping[str, Any],
    batch_table: Mapping[str, Any],
    gpu_memory_mib: int | None,
    gpus: int = 1,
) -> ResolvedYolo:
    """What a run of this (already validated) ``yolo`` section trains with.

    The spec wins over the image's defaults, which win over the built-in ones. With several
    GPUs the table's per-GPU batch is multiplied: Ultralytics' DDP splits ``batch`` across them.
    """
    defaults = dict(image_defaults or {})
    yolo = {key: value for key, value in yolo.items() if value is not None}  # None: left out of the spec
    epochs = yolo.get("epochs", defaults.get("epochs", BUILTIN_DEFAULTS["epochs"]))
    imgsz = yolo.get("imgsz", defaults.get("imgsz", BUILTIN_DEFAULTS["imgsz"]))
    extra = {key: value for key, value in defaults.items() if key in EXTRA_ARGS and EXTRA_ARGS[key](value)}
    extra.setdefault("save_period", DEFAULT_SAVE_PERIOD)
    extra.update(yolo.get("extra") or {})
    export = tuple(dict.fromkeys(yolo.get("export", defaults.get("export", list(DEFAULT_EXPORT)))))

    per_gpu = batch_from_table(batch_table, gpu_memory_mib)
    recommended = per_gpu * max(gpus, 1) if per_gpu else None
    advice = None
    if recommended is not None and gpu_memory_mib is not None:
        size = gpu_size_words(gpu_memory_mib)
        where = f"a {size} GPU" if gpus <= 1 else f"{gpus} × {size} GPUs ({per_gpu} per GPU)"
        advice = f"batch {recommended} for {where} with this model"
    warnings: list[str] = []
    if yolo.get("batch") is not None:
        batch, source = yolo["batch"], "spec"
        if recommended is not None and batch > recommended:
            warnings.append(
                f"batch {batch} is more than the {recommended} this image recommends for "
                f"{where}; it may run out of GPU memory (leave batch out to use {recommended}, "
                "or use -1 for AutoBatch)"
            )
    elif recommended is not None:
        batch, source = recommended, "table"
    elif isinstance(defaults.get("batch"), int) and not isinstance(defaults["batch"], bool):
        batch, source = defaults["batch"], "image default"
    else:
        batch, source = FALLBACK_BATCH, "fallback"
    return ResolvedYolo(
        epochs=epochs, imgsz=imgsz, batch=batch, extra=extra, export=export, batch_source=source,
        advice=advice, warnings=tuple(warnings),
    )
