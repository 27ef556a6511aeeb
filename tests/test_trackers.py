"""training.tracker: TensorBoard, wandb (offline) and MLflow (a file store) each get the same
scalars at the same steps, wandb and MLflow also the config and the run folder, read back with
each library's own reader; only rank 0 writes; a missing package stops the run in one line; the
user's WANDB_MODE and MLFLOW_TRACKING_URI / MLFLOW_EXPERIMENT_NAME win over the defaults.
The suite blocks sockets (pytest-socket); wandb-core runs in a subprocess, where the offline
settings in common/training/trackers.py keep it off the network (checked there with strace)."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.config import ConfigError, config_to_dict, load_config
from common.errors import UserError
from common.training.telemetry import EpochReadings, TrainingMetrics
from common.training.trackers import flat_config, open_tracker

from ci_helpers import unavailable
from test_trainer import _config, _trainer

torch.set_num_threads(1)
# urllib3 (imported by tensorboard, wandb and mlflow) probes for IPv6 by creating a socket at import: no traffic
pytestmark = pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")

STORES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlruns"}
# what one log step at 2, one at 4 and an epoch at 4 send (metrics.log_step / log_epoch)
EXPECTED = {
    "train/step_loss": [(2, 1.5), (4, 1.25)],
    "train/lr": [(2, 1e-3), (4, 2e-3)],
    "train/tokens_per_sec": [(2, 1000.0), (4, 1100.0)],
    "train/grad_norm": [(2, 0.5), (4, 0.25)],
    "epoch/mfu": [(4, 0.125)],
    "epoch/train_loss": [(4, 1.375)],
    "epoch/val_loss": [(4, 1.5)],
}


@pytest.fixture(autouse=True)
def _no_user_settings(monkeypatch):
    """Each test starts without the user's tracker settings, and what a tracker sets in the
    environment (WANDB_MODE) is undone after it."""
    for name in ("WANDB_MODE", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.setenv(name, "")  # recorded, so that teardown restores the original
        monkeypatch.delenv(name)


def _need(tracker: str) -> None:
    module = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}[tracker]
    if importlib.util.find_spec(module) is None:
        unavailable(f"{module} is not installed (pip install -e '.[test]')")


def _log(metrics: TrainingMetrics) -> None:
    metrics.log_step(2, 1.5, 1e-3, 1000.0, 0.5)
    metrics.log_step(4, 1.25, 2e-3, 1100.0, 0.25)
    metrics.log_epoch(4, {"epoch/train_loss": 1.375, "epoch/val_loss": 1.5}, EpochReadings(1100.0, 0.125, None))
    metrics.close()


def read_tensorboard(run: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    return {"scalars": {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}}


def read_wandb(run: Path) -> dict:
    """The offline run's records, through wandb's own reader (`wandb leet inspect --json`)."""
    (log,) = run.glob("wandb/offline-run-*/run-*.wandb")
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    records = [json.loads(line) for line in out.splitlines() if line.strip()]
    scalars: dict = {}
    for r in records:
        if r["type"] == "history":
            for tag, value in r["history"]["item"].items():
                if not tag.startswith("_"):
                    scalars.setdefault(tag, []).append((r["history"]["step"].get("num", 0), value))
    (start,) = [r["run"] for r in records if r["type"] == "run"]
    return {"scalars": scalars, "config": start["config"]["update"], "name": start["display_name"]}


def read_mlflow(run: Path, uri: str = "") -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri or (run / "mlruns").resolve().as_uri())
    (found,) = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], filter_string=f"tags.run_dir = '{run}'"
    )
    scalars = {
        tag: [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, tag)]
        for tag in found.data.metrics
    }
    return {
        "scalars": scalars,
        "params": found.data.params,
        "tags": found.data.tags,
        "name": found.info.run_name,
        "status": found.info.status,
    }


READERS = {"tensorboard": read_tensorboard, "wandb": read_wandb, "mlflow": read_mlflow}


@pytest.mark.parametrize("tracker", list(STORES))
def test_each_tracker_gets_the_same_scalars_and_wandb_mlflow_the_config_and_run_folder(tmp_path, tracker):
    _need(tracker)
    run = tmp_path / "tiny_20240101_000000"
    cfg = _config(tracker=tracker)
    cfg.experiment = "tiny"
    metrics = TrainingMetrics(
        run,
        torch.device("cpu"),
        1,
        is_main=True,
        tensorboard=True,
        flops_per_token=1,
        tracker=tracker,
        config=config_to_dict(cfg),
    )
    _log(metrics)
    assert sorted(p.name for p in run.iterdir()) == [STORES[tracker]]  # its store, inside the run folder
    got = READERS[tracker](run)
    assert set(got["scalars"]) == set(EXPECTED)
    for tag, points in EXPECTED.items():
        assert [s for s, _ in got["scalars"][tag]] == [s for s, _ in points], tag
        assert [v for _, v in got["scalars"][tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag
    if tracker == "wandb":
        assert got["config"]["run_dir"] == str(run) and got["name"] == run.name
        assert got["config"]["model"]["d_model"] == 32 and got["config"]["training"]["tracker"] == "wandb"
    if tracker == "mlflow":
        assert got["tags"]["run_dir"] == str(run) and got["name"] == run.name and got["status"] == "FINISHED"
        assert got["params"]["model.d_model"] == "32" and got["params"]["training.tracker"] == "mlflow"
        assert len(got["params"]) == len(flat_config(config_to_dict(cfg)))


@pytest.mark.parametrize("tracker", list(STORES))
def test_only_rank_0_writes(tmp_path, tracker, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # not even installed elsewhere
    metrics = TrainingMetrics(
        tmp_path / "run",
        torch.device("cpu"),
        2,
        is_main=False,
        tensorboard=True,
        flops_per_token=1,
        tracker=tracker,
        config={},
    )
    _log(metrics)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("tracker", ["wandb", "mlflow"])
def test_a_missing_package_is_one_line_before_training(tmp_path, tracker, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == tracker else real(name, *a))
    with pytest.raises(
        UserError,
        match=rf'training.tracker = "{tracker}" needs the {tracker} package: '
        rf'pip install -e "\.\[{tracker}\]"',
    ):
        TrainingMetrics(
            tmp_path, torch.device("cpu"), 1, is_main=True, tensorboard=True, flops_per_token=1, tracker=tracker
        )


def test_an_unknown_tracker_is_a_config_error(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"training": {"tracker": "comet"}}))
    with pytest.raises(ConfigError, match="training.tracker"):
        load_config(path)


@pytest.mark.parametrize("tracker", ["wandb", "mlflow"])
def test_a_training_run_logs_what_tensorboard_gets(tmp_path, tracker):
    """training.tracker reaches the Trainer: the same seeded run logs the same tags at the same
    steps as with TensorBoard, the same losses (throughput is a timing, so only its steps)."""
    _need(tracker)
    _need("tensorboard")
    got = {}
    for name in ("tensorboard", tracker):
        tr = _trainer(tmp_path / name, out=io.StringIO(), tracker=name, epochs=1, max_steps_per_epoch=4)
        tr.metrics.tensorboard = True  # _trainer turns the tracker off
        assert tr.train() == "finished"
        assert not (tmp_path / name / STORES["tensorboard" if name != "tensorboard" else "wandb"]).exists()
        got[name] = READERS[name](tmp_path / name)["scalars"]
    reference, scalars = got["tensorboard"], got[tracker]
    assert set(scalars) == set(reference) and {"train/step_loss", "loss/train", "loss/val", "epoch/lr"} <= set(scalars)
    assert [s for s, _ in scalars["train/step_loss"]] == [2, 4]
    for tag in reference:
        assert [s for s, _ in scalars[tag]] == [s for s, _ in reference[tag]], tag
        if "tokens_per_sec" not in tag:
            assert [v for _, v in scalars[tag]] == pytest.approx([v for _, v in reference[tag]], rel=1e-6), tag


def test_mlflow_follows_the_users_tracking_uri_and_experiment(tmp_path, monkeypatch):
    """MLFLOW_TRACKING_URI: every run in one store, to compare them in one UI, grouped by the
    config's experiment (or MLFLOW_EXPERIMENT_NAME); nothing in the run folders."""
    _need("mlflow")
    from mlflow.tracking import MlflowClient

    store = (tmp_path / "shared").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    runs = [tmp_path / f"tiny_2024010{i}_000000" for i in (1, 2, 3)]
    for i, run in enumerate(runs):
        if i == 2:
            monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "sweep")
        tracker = open_tracker("mlflow", run, {"experiment": "tiny", "model": {"d_model": 32}})
        tracker.scalar("loss/val", 1.0 + i, 4)
        tracker.close()
        assert not run.exists()  # the store is the user's
    client = MlflowClient(tracking_uri=store)
    experiments = {e.name: e.experiment_id for e in client.search_experiments()}
    assert set(experiments) >= {"tiny", "sweep"}
    grouped = {
        name: sorted(r.info.run_name for r in client.search_runs([experiments[name]])) for name in ("tiny", "sweep")
    }
    assert grouped == {"tiny": [runs[0].name, runs[1].name], "sweep": [runs[2].name]}
    for i, run in enumerate(runs):
        got = read_mlflow(run, store)
        assert got["scalars"] == {"loss/val": [(4, 1.0 + i)]} and got["params"]["model.d_model"] == "32"


def test_wandb_follows_the_users_mode_and_is_offline_by_default(tmp_path, monkeypatch):
    """WANDB_MODE set by the user is honoured (disabled here: no network needed, nothing written);
    unset, the run is offline."""
    _need("wandb")
    import os

    monkeypatch.setenv("WANDB_MODE", "disabled")
    tracker = open_tracker("wandb", tmp_path / "off", {"experiment": "tiny"})
    tracker.scalar("loss/val", 1.0, 2)
    tracker.close()
    assert tracker.run.settings.mode == "disabled" and not list((tmp_path / "off").glob("wandb/*run-*"))

    monkeypatch.delenv("WANDB_MODE")
    tracker = open_tracker("wandb", tmp_path / "default", {"experiment": "tiny"})
    tracker.close()
    assert os.environ["WANDB_MODE"] == "offline" and tracker.run.settings.mode == "offline"
    assert len(list((tmp_path / "default").glob("wandb/offline-run-*/run-*.wandb"))) == 1
