"""Where the Trainer's scalars go (training.tracker): TensorBoard, Weights & Biases or MLflow.

Each tracker gets the same scalars (tag, value, global step). wandb and MLflow also get the run's
config and its folder's path, since their stores are read away from the run folder. By default
every store lives inside the run folder and none sends anything over a network:

    tensorboard  run_dir/tensorboard   (the default; as before)
    wandb        run_dir/wandb         offline mode, no login, no telemetry; `wandb sync` uploads it later
    mlflow       run_dir/mlruns        a file:// store (MLflow's file backend), telemetry off;
                                       `mlflow ui --backend-store-uri file://RUN_DIR/mlruns`

The user's own settings win over those defaults: WANDB_MODE (e.g. online where the node has
internet, disabled), MLFLOW_TRACKING_URI (one store or server for many runs, to compare them in
one UI) and MLFLOW_EXPERIMENT_NAME (else the config's experiment).

wandb and MLflow are optional (setup.cfg extras `wandb`, `mlflow`) and imported only when chosen.
Their network switches are environment variables read at import, so they are set here first,
for the whole process.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Mapping, Protocol

from common.errors import UserError

__all__ = ["TRACKERS", "Tracker", "check_tracker", "flat_config", "mlflow_store", "open_tracker", "wandb_mode"]

TRACKERS = ("tensorboard", "wandb", "mlflow")
_PACKAGES = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}  # tracker: (module, setup.cfg extra)


class Tracker(Protocol):
    def scalar(self, tag: str, value: float, step: int) -> None: ...

    def close(self) -> None: ...


def check_tracker(name: str) -> None:
    """A UserError before training starts when the chosen tracker's package is missing."""
    if name in _PACKAGES and importlib.util.find_spec(_PACKAGES[name][0]) is None:
        extra = _PACKAGES[name][1]
        raise UserError(
            f'training.tracker = "{name}" needs the {name} package: pip install -e ".[{extra}]" '
            '(or set training.tracker = "tensorboard")'
        )


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"model": {"d_model": 32}} -> {"model.d_model": 32}: MLflow's params are flat."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def wandb_mode() -> str:
    """The user's WANDB_MODE (online, disabled, ...) when set, else offline."""
    return os.environ.get("WANDB_MODE") or "offline"


def mlflow_store(run_dir: Path, config: Mapping[str, Any]) -> tuple[str, str]:
    """(tracking URI, experiment name): the user's MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME
    when set, else the file store run_dir/mlruns and the config's experiment (runs of one config
    group together in a shared store)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
    return uri, os.environ.get("MLFLOW_EXPERIMENT_NAME") or str(config.get("experiment") or "marketgpt")


def open_tracker(name: str, run_dir: Path, config: Mapping[str, Any], resumed_at: int = 0) -> Tracker:
    """The chosen tracker, its store inside `run_dir` unless the environment names another
    (mlflow_store). resumed_at: the global step a resumed run restarts from (TensorBoard drops
    what an earlier session logged after it)."""
    check_tracker(name)
    if name == "wandb":
        return _Wandb(run_dir, config)
    if name == "mlflow":
        return _MLflow(run_dir, config)
    return _TensorBoard(run_dir, resumed_at)


class _TensorBoard:
    def __init__(self, run_dir: Path, resumed_at: int) -> None:
        from torch.utils.tensorboard import SummaryWriter  # slow import: only when used

        # After a resume, drop what an earlier session logged past the checkpoint (steps
        # beyond the resumed global step): that part of the run is being redone.
        self.writer = SummaryWriter(
            log_dir=str(run_dir / "tensorboard"), purge_step=resumed_at + 1 if resumed_at else None
        )

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    """A wandb run in run_dir/wandb, offline unless WANDB_MODE says otherwise; each training
    session (a resume too) is one run."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any]) -> None:
        # Read by wandb at import and set-up: the mode from the start (with the mode given only to
        # init(), wandb 0.31 still starts a telemetry exporter that looks up its server) and no
        # error reports unless the user asks. Seen with strace: no AF_INET socket is opened offline.
        mode = os.environ["WANDB_MODE"] = wandb_mode()
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        import wandb  # optional: the `wandb` extra

        (run_dir / "wandb").mkdir(parents=True, exist_ok=True)
        # the user's WANDB_MODE as set (wandb checks it): a str, not wandb's Literal
        settings = wandb.Settings(mode=mode, silent=True, disable_git=True)  # type: ignore[arg-type]
        self.run = wandb.init(
            dir=str(run_dir),
            project=str(config.get("experiment") or "marketgpt"),
            name=run_dir.name,
            config={**config, "run_dir": str(run_dir)},
            settings=settings,
        )

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.run.log({tag: value}, step=step)

    def close(self) -> None:
        self.run.finish()


class _MLflow:
    """A run in the store of mlflow_store: MLFLOW_TRACKING_URI's, else the file store run_dir/mlruns."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any]) -> None:
        # Read by MLflow at import and use: no usage telemetry (it would send a request), and its
        # file store, which MLflow 3 keeps in maintenance mode and refuses unless allowed.
        os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        from mlflow.tracking import MlflowClient  # optional: the `mlflow` extra

        uri, name = mlflow_store(run_dir, config)
        self.client = MlflowClient(tracking_uri=uri)
        experiment_id = self._experiment(name)
        self.run_id = self.client.create_run(
            experiment_id, run_name=run_dir.name, tags={"run_dir": str(run_dir)}
        ).info.run_id
        for key, value in flat_config(config).items():
            self.client.log_param(self.run_id, key, "null" if value is None else value)

    def _experiment(self, name: str) -> str:
        """The experiment's id, created if new; in a shared store another run may create it meanwhile."""
        from mlflow.exceptions import MlflowException

        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            try:
                return self.client.create_experiment(name)
            except MlflowException:
                experiment = self.client.get_experiment_by_name(name)
                if experiment is None:
                    raise
        return experiment.experiment_id

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.client.log_metric(self.run_id, tag, float(value), step=step)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
