"""Hyper-parameter tuning as a run (a job's ``tune:``, issue #17).

Ultralytics' built-in tuner (``model.tune``, no Ray) mutates hyper-parameters from the best
results so far and trains one model per iteration. Its own loop (``Tuner.__call__``) does not
fit a slot: it trains every iteration in a ``yolo train`` subprocess that our stop callbacks do
not reach, and an iteration a SIGTERM kills is recorded as a failed one (fitness 0) that the
next mutation then learns from. So the runner drives the iterations itself and uses
Ultralytics' ``Tuner`` for the rest: its default search space, its mutation (``_mutate``), its
results file (``tune_results.ndjson``, Ultralytics' own format) and its choice of the best.

Files under ``output_dir``::

    tune/tune_results.ndjson        one line per finished iteration: the checkpoint between iterations
    tune/pending.json               the iteration in progress and its hyper-parameters
    tune/iter<N>/                   iteration N's training (kept for the best iteration only)
    tune/weights/best.pt            the best iteration's weights
    tune/best_hyperparameters.yaml  the best values, as Ultralytics writes them
    events.jsonl, termination.json, artifacts.json   as for a training run (run.py)

A stop (SIGTERM, ``must_end_by``) ends the iteration in progress at its next batch without
saving it and exits 75: only that iteration is lost. The next run reads ``tune_results.ndjson``
and trains the interrupted iteration again, from the start and with the same hyper-parameters
(``pending.json``), then goes on with the next ones.

Events: each finished iteration is an ``iteration`` event (epoch = the iteration, epochs = all
iterations; metrics: ``fitness``, ``best_fitness``, ``best_iteration``, the validation metrics,
``iteration_s`` and every tuned value as ``hyp.<name>``); the training events of an iteration
(``started``, ``batch``, ``epoch``, ``final``) are those of a training run.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import IO, Any

from training.runner import exitcodes
from training.runner.artifacts import write_manifest
from training.runner.dataset import check_data_yaml
from training.runner.run import REPORT_FLUSH_ON_STOP_S, Runner, _Progress, _round
from training.runner.spec import TUNE_DEFAULT_OPTIMIZER, RunSpec, tunable
from training.runner.stop import Preempted

TUNE_DIR_NAME = "tune"
RESULTS_FILE = "tune_results.ndjson"  # Ultralytics' name: `yolo tune` can read it too
PENDING_FILE = "pending.json"
BEST_FILE = "best_hyperparameters.yaml"


class TuneRunner(Runner):
    def __init__(self, spec: RunSpec, out: IO[str]) -> None:
        super().__init__(spec, out)
        assert spec.tune is not None
        self.iterations = spec.tune.iterations
        self.stop.save_mid_epoch = False  # an interrupted iteration restarts: its checkpoint is never read
        self.tune_dir = spec.output_dir / TUNE_DIR_NAME
        self.done = 0  # iterations recorded in tune_results.ndjson
        self.best: dict[str, Any] | None = None  # the best record so far

    # -- the iterations -------------------------------------------------------------------------

    def _run(self) -> int:
        YOLO = self._setup()
        self.phase = "data"
        check_data_yaml(self.spec.data)  # before Ultralytics can exec a `download:` entry
        self.phase = "model"
        tuner = self._tuner()
        self.done = len(tuner._load_local_results())
        if self.done:
            self._keep_best(tuner)  # a stop right after an iteration was recorded may have left it half done
        for iteration in range(self.done + 1, self.iterations + 1):
            if self.stop.requested():
                raise Preempted
            self._iteration(YOLO, tuner, iteration)
        return self._finish()

    def _tuner(self) -> Any:
        """Ultralytics' Tuner over this run's arguments: the first iteration trains with the
        spec's own values, later ones with mutations of the best so far."""
        from ultralytics.engine.tuner import Tuner

        space = self.spec.tune.space
        args = {
            **self._iteration_args(),
            "model": self.spec.model,
            "save_dir": str(self.tune_dir),  # Ultralytics' tune_dir: tune_results.ndjson lives here
            "space": {key: tuple(bounds) for key, bounds in space.items()} if space else None,
        }
        tuner = Tuner(args=args)
        if not space:
            # Ultralytics' default space, less what the allowlist refuses (the best values must
            # make a valid job spec).
            tuner.space = {key: bounds for key, bounds in tuner.space.items() if tunable(key)}
        self.tune_dir.mkdir(parents=True, exist_ok=True)
        return tuner

    def _iteration_args(self) -> dict[str, Any]:
        args = self._train_args(resume=False)
        args.setdefault("optimizer", TUNE_DEFAULT_OPTIMIZER)  # as model.tune() does
        # Every iteration validates (its fitness is the point); no plots to draw per iteration.
        args.update(val=True, plots=False)
        return args

    def _iteration(self, YOLO: Any, tuner: Any, iteration: int) -> None:
        hyperparameters = self._hyperparameters(tuner, iteration)
        save_dir = self.tune_dir / f"iter{iteration}"
        shutil.rmtree(save_dir, ignore_errors=True)  # what an interrupted try of it left
        self.phase = "model"
        model = YOLO(self.spec.model)
        _Progress(self).attach(model)
        self.stop.attach(model)
        self.phase = "trainer"
        args = {**self._iteration_args(), **hyperparameters, "save_dir": str(save_dir)}
        started = time.monotonic()
        try:
            model.train(trainer=self._trainer_class(model), **args)
        finally:
            self.trainer = getattr(model, "trainer", None)
        # As Ultralytics' MultiTrainer reads it: final_eval's validation of best.pt.
        metrics = {key: float(value) for key, value in model.trainer.validator.metrics.results_dict.items()}
        fitness = metrics.get("fitness") or 0.0
        dataset = self._dataset_name()
        record = tuner._result_record(iteration, fitness, hyperparameters, {dataset: metrics}, {dataset: str(save_dir)})
        tuner._save_local_result(record)  # the checkpoint between iterations
        (self.tune_dir / PENDING_FILE).unlink(missing_ok=True)
        self.done = iteration
        best = self._keep_best(tuner)
        self._emit(
            "iteration",
            epoch=iteration,
            epochs=self.iterations,
            metrics={
                "iteration": iteration,
                "iterations": self.iterations,
                "fitness": record["fitness"],
                "best_fitness": best["fitness"],
                "best_iteration": best["iteration"],
                "iteration_s": time.monotonic() - started,
                **{key: value for key, value in metrics.items() if key != "fitness"},
                **{f"hyp.{key}": value for key, value in hyperparameters.items()},
            },
            detail={"hyperparameters": hyperparameters},
        )

    def _hyperparameters(self, tuner: Any, iteration: int) -> dict[str, Any]:
        """The values iteration ``iteration`` trains with: those a stop interrupted, else a new mutation."""
        pending = self.tune_dir / PENDING_FILE
        try:
            saved = json.loads(pending.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            saved = {}
        if saved.get("iteration") == iteration and isinstance(saved.get("hyperparameters"), dict):
            return saved["hyperparameters"]
        hyperparameters = tuner._mutate()
        partial = pending.with_name(PENDING_FILE + ".tmp")
        partial.write_text(json.dumps({"iteration": iteration, "hyperparameters": hyperparameters}), encoding="utf-8")
        partial.replace(pending)
        return hyperparameters

    def _keep_best(self, tuner: Any) -> dict[str, Any]:
        """Ultralytics' bookkeeping after an iteration: the best record's weights in
        tune/weights, its values in best_hyperparameters.yaml, the other iterations' folders gone."""
        from ultralytics.cfg import CFG_INT_KEYS
        from ultralytics.utils import YAML

        results = tuner._load_local_results()
        table = tuner._local_results_to_array(results)
        index = tuner._best_result_index(results, table[:, 0])
        best = results[index]
        best_dir = Path(next(iter(best["save_dirs"].values())))
        source, target = best_dir / "weights" / "best.pt", self.tune_dir / "weights" / "best.pt"
        if source.is_file() and (not target.is_file() or target.stat().st_mtime < source.stat().st_mtime):
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name("best.pt.partial")
            shutil.copy2(source, partial)
            os.replace(partial, target)
        for folder in self.tune_dir.glob("iter*"):
            if folder.is_dir() and folder != best_dir:
                shutil.rmtree(folder, ignore_errors=True)
        values = {
            key: int(value) if key in CFG_INT_KEYS else float(value)
            for key, value in zip(tuner.space, table[index, 1:], strict=True)
        }
        header = (
            f"# Best of {len(results)} iteration(s): iteration {best['iteration']}, fitness {best['fitness']}\n"
            f"# Train with these as the `yolo.extra` of a new job (optimizer {self._optimizer()}).\n"
        )
        YAML.save(self.tune_dir / BEST_FILE, data=values, header=header)
        self.best = {"iteration": best["iteration"], "fitness": best["fitness"], "hyperparameters": values}
        return self.best

    def _optimizer(self) -> str:
        return str(self.spec.extra.get("optimizer", TUNE_DEFAULT_OPTIMIZER))

    def _dataset_name(self) -> str:
        """The key Ultralytics' MultiTrainer gives a dataset: its folder for a data.yaml."""
        data = self.spec.data
        return data.parent.name if data.stem == "data" and data.parent.name else data.stem

    # -- the end --------------------------------------------------------------------------------

    def _finish(self) -> int:
        files = [
            (self.tune_dir / "weights" / "best.pt", "weights"),
            (self.tune_dir / BEST_FILE, "config"),
            (self.tune_dir / RESULTS_FILE, "metrics"),
        ]
        manifest, artifacts = write_manifest(self.spec.run_id, self.spec.output_dir, files)
        self._emit("artifacts", epoch=self.iterations, epochs=self.iterations,
                   detail={"manifest": str(manifest), "artifacts": artifacts})
        best = self.best or {}
        weights = self.tune_dir / "weights" / "best.pt"
        return self._end(
            "succeeded",
            exitcodes.EXIT_SUCCEEDED,
            reason="done",
            epoch=self.iterations,
            weights=str(weights) if weights.is_file() else None,
            manifest=str(manifest),
            best_iteration=best.get("iteration"),
            best_fitness=best.get("fitness"),
            best_hyperparameters=best.get("hyperparameters"),
            optimizer=self._optimizer(),
        )

    def _checkpointed(self) -> int:
        self._close_loaders()
        since = self.stop.requested_monotonic
        return self._end(
            "checkpointed",
            exitcodes.EXIT_CHECKPOINTED,
            reason=self.stop.reason or "stopped",
            epoch=self.done,
            stopped_in_iteration=self.done + 1 if self.done < self.iterations else None,
            tune_results=str(self.tune_dir / RESULTS_FILE) if self.done else None,
            stop_s=_round(time.monotonic() - since) if since is not None else None,
            flush_s=REPORT_FLUSH_ON_STOP_S,
        )

    def _deadline_passed(self) -> None:
        code = self._end(
            "checkpointed",
            exitcodes.EXIT_CHECKPOINTED,
            reason=f"must_end_by reached before the run could stop at a batch boundary (during {self.phase}); "
            "the finished iterations are kept",
            epoch=self.done,
            tune_results=str(self.tune_dir / RESULTS_FILE) if self.done else None,
            forced=True,
            flush_s=1.0,
        )
        if code is not None:
            os._exit(code)

    def _end(self, status: str, code: int, **fields: Any) -> int | None:
        # Progress of a tune counts iterations: the end's epoch/epochs are iterations.
        self.epochs = self.iterations
        if self.events is not None:
            self.events.epochs = self.iterations
        return super()._end(status, code, **fields)
