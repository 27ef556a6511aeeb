"""GPU readiness, tested on the CPU: no silent CPU fallback (Slurm variables set in the test, a
fake nvidia-smi), one GPU per rank, precision and its GradScaler on resume, one host sync per
step with the same results as a plain loop, the optimizer's kernel flags after a resume, RNG
streams of ranks added on resume, gradient checkpointing (same gradients, less memory by
torch's profiler), and GPU health in the epoch log from faked torch.cuda and NVML."""

from __future__ import annotations

import io
import json
import sys
import types
import warnings

import pytest
import torch

from common.config import ModelConfig
from common.distributed import gpu_health as gpu_health_mod, precision
from common.distributed.env import DistEnv, check_gpus_usable, detect_env, rank_device
from common.distributed.precision import inference_precision, resolve_precision
from common.errors import UserError
from common.model.gpt import MarketGPT
from common.model.memory import estimate_training_memory
from common.paths import REPO_ROOT
from common.run.checkpoint import latest_good_checkpoint, load_checkpoint
from common.slurm.submit import local_gpus
from common.training import gpu_stats as gpu_stats_mod
from common.training.lr_schedule import lr_at
from common.training.rng import seed_everything

from run_helpers import run_of
from test_trainer import WINDOWS, _config, _late, _trainer

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")
SLURM_2_GPUS = {
    "SLURM_PROCID": "0",
    "SLURM_STEP_ID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_LOCALID": "0",
    "SLURM_TASKS_PER_NODE": "2",
    "SLURM_GPUS_ON_NODE": "2",
    "SLURM_JOB_ID": "77",
}


def _fake_cuda(monkeypatch, names=("NVIDIA A100-SXM4-80GB",), capability=(8, 0)) -> None:
    """torch.cuda as a node with these GPUs would answer (no kernel ever runs)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(names))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: names[getattr(d, "index", None) or 0])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: capability)


# --------------------------------------------------------------------------- no silent CPU fallback


def test_a_job_given_gpus_stops_when_torch_is_a_cpu_build(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    env = detect_env(SLURM_2_GPUS)
    with pytest.raises(UserError, match=r"given GPUs \(SLURM_GPUS_ON_NODE=2\) but this torch .* is a CPU build"):
        check_gpus_usable(env)
    with pytest.raises(UserError, match=r"given GPUs \(--num-gpus 1\)"):
        check_gpus_usable(DistEnv(), num_gpus=1)
    with pytest.raises(UserError, match=r"given GPUs \(training.device=cuda\)"):
        check_gpus_usable(DistEnv(), device="cuda")
    check_gpus_usable(env, num_gpus=2, device="cpu")  # the CPU on purpose
    check_gpus_usable(DistEnv())  # nothing asked for a GPU: the CPU is fine


def test_a_driver_older_than_the_wheels_cuda_is_named_with_both_versions(monkeypatch, tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 470.82.01\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError) as e:
        check_gpus_usable(detect_env(SLURM_2_GPUS))
    assert "built for CUDA 12.8" in str(e.value) and "NVIDIA driver: 470.82.01" in str(e.value)


def test_train_under_slurm_with_gpus_but_cpu_torch_exits_2_before_any_work(monkeypatch, tmp_path, capsys):
    from common.cli import main

    for key, value in SLURM_2_GPUS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = tmp_path / "case" / "configs" / "c.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"data": {"source": "sample"}}))
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "this job was given GPUs (SLURM_GPUS_ON_NODE=2)" in err[0]
    assert "training.device=cpu" in err[0]
    assert not (tmp_path / "case" / "checkpoints").exists()  # stopped before any run folder


def test_more_ranks_on_a_node_than_gpus_is_a_clear_error(monkeypatch):
    _fake_cuda(monkeypatch)  # one visible GPU
    torchrun = DistEnv(rank=1, world_size=2, local_rank=1, local_world_size=2, launcher="torchrun")
    with pytest.raises(UserError, match=r"runs 2 processes of the job but rank 1 \(local rank 1\) sees 1 GPU"):
        rank_device(torchrun)
    # Slurm bound one GPU to each task: one visible GPU each is right
    bound = DistEnv(rank=1, world_size=2, local_rank=1, local_world_size=2, launcher="slurm", gpus_on_node=2)
    assert rank_device(bound) == torch.device("cuda", 0)
    assert rank_device(torchrun, device="cpu") == torch.device("cpu")
    _fake_cuda(monkeypatch, names=("NVIDIA A100-SXM4-80GB",) * 2)
    assert rank_device(torchrun) == torch.device("cuda", 1)


def test_submit_local_gives_the_job_its_gpus(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(
        UserError,
        match=r"--local runs one process per GPU but this torch .* CPU build.*"
        r"--set training.device=cpu",
    ):
        local_gpus(2)  # said before submitting, not by each task of the job
    assert local_gpus(2, device="cpu") == 0
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    _fake_cuda(monkeypatch, names=("NVIDIA A100-SXM4-80GB",) * 2)
    assert local_gpus(2) == 2
    assert local_gpus(2, device="cpu") == 0
    with pytest.raises(UserError, match=r"--local runs 4 process\(es\), one per GPU, but this machine has 2"):
        local_gpus(4)


# --------------------------------------------------------------------------- precision


def test_auto_precision_per_gpu_generation(monkeypatch):
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    _fake_cuda(monkeypatch, capability=(8, 0))
    assert resolve_precision("auto", torch.device("cuda", 0)) == "bf16"
    _fake_cuda(monkeypatch, names=("Tesla V100-SXM2-32GB",), capability=(7, 0))
    assert resolve_precision("auto", torch.device("cuda", 0)) == "fp16"
    with pytest.raises(UserError, match=r"training.precision=bf16 but Tesla V100-SXM2-32GB .*7\.0"):
        resolve_precision("bf16", torch.device("cuda", 0))
    assert resolve_precision("fp32", torch.device("cuda", 0)) == "fp32"


def test_forecast_precision_auto_is_the_runs_own_where_bf16_is_in_hardware(monkeypatch):
    cpu = torch.device("cpu")
    for caps, trained, expected in (
        ({"avx512_bf16": True}, "bf16", "bf16"),
        ({"amx_bf16": True}, "bf16", "bf16"),
        ({"avx2": True}, "bf16", "fp32"),  # emulated bf16 is slower than fp32
        ({"avx512_bf16": True}, "fp32", "fp32"),
        ({"avx512_bf16": True}, None, "fp32"),
    ):
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda caps=caps: caps)
        assert inference_precision("auto", trained, cpu) == expected, (caps, trained)
    assert inference_precision("bf16", "fp32", cpu) == "bf16" and inference_precision("fp32", "bf16", cpu) == "fp32"
    with pytest.raises(UserError, match="--precision 'fp16'"):
        inference_precision("fp16", "fp16", cpu)
    _fake_cuda(monkeypatch, capability=(8, 0))
    assert inference_precision("auto", "bf16", torch.device("cuda", 0)) == "bf16"
    _fake_cuda(monkeypatch, names=("Tesla V100-SXM2-32GB",), capability=(7, 0))
    assert inference_precision("auto", "fp16", torch.device("cuda", 0)) == "fp32"
    with pytest.raises(UserError, match="--precision bf16 but Tesla V100-SXM2-32GB"):
        inference_precision("bf16", None, torch.device("cuda", 0))


def test_fp16_resume_carries_the_grad_scaler_and_checkpoints_keep_fp32_weights(tmp_path):
    out = io.StringIO()
    tr = _trainer(tmp_path, out=out, precision="fp16")
    # a scaler that has moved away from the defaults: growth every step from 1024
    tr.step.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)
    assert tr.train(stop_after_steps=3) == "stopped"
    assert "Precision: fp16 autocast with a GradScaler" in out.getvalue()
    state = load_checkpoint(latest_good_checkpoint(tmp_path))
    assert state["grad_scaler"]["scale"] == tr.step.scaler.get_scale() != 65536.0
    assert all(v.dtype == torch.float32 for v in state["model"].values() if v.is_floating_point())
    resumed = _trainer(tmp_path, precision="fp16")
    resumed.load_state_dict(state)
    assert resumed.step.scaler.state_dict() == tr.step.scaler.state_dict()
    assert resumed.train() == "finished"


def test_fp16_overflow_skips_the_step_and_lowers_the_scale_instead_of_failing(tmp_path):
    tr = _trainer(tmp_path, precision="fp16")
    tr.step.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**100)  # fp16 gradients overflow at once
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    assert tr.train(stop_after_steps=1) == "stopped"
    assert tr.step.scaler.get_scale() == 2.0**99
    assert all(torch.equal(v, before[k]) for k, v in tr.model.state_dict().items())  # the step was skipped


def test_bf16_checkpoints_hold_fp32_master_weights(tmp_path):
    tr = _trainer(tmp_path, precision="bf16")
    assert tr.train(stop_after_steps=2) == "stopped" and tr.log.precision == "bf16"
    state = load_checkpoint(latest_good_checkpoint(tmp_path))
    assert state["grad_scaler"] is None
    assert all(v.dtype == torch.float32 for v in state["model"].values() if v.is_floating_point())
    assert all(s["exp_avg"].dtype == torch.float32 for s in state["optimizer"]["state"].values())


# --------------------------------------------------------------------------- one host sync per step


def _reference_run(steps: int, **training) -> tuple[dict, list[float]]:
    """The textbook loop the Trainer must equal bit for bit: same seed, batches, schedule."""
    cfg = _config(**training)
    t = cfg.training
    seed_everything(t.seed)
    model = MarketGPT(cfg.model, num_assets=2, num_categories=1)
    opt = model.configure_optimizer(t.weight_decay, t.learning_rate, (t.beta1, t.beta2), "cpu")
    per_epoch = min(
        WINDOWS.num_batches("train", t.batch_size, 1, drop_last=True) // t.grad_accum_steps, t.max_steps_per_epoch
    )
    batches = WINDOWS.batches(
        "train", t.batch_size, shuffle=True, seed=t.seed, epoch=0, drop_last=True, limit=per_epoch * t.grad_accum_steps
    )
    model.train()
    norms = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, t.learning_rate, t.warmup_steps, t.epochs * per_epoch, t.min_lr_ratio)
        for _ in range(t.grad_accum_steps):
            b = next(batches)
            _, loss = model(b.x, b.asset_ids, b.category_ids, b.y)
            (loss / t.grad_accum_steps).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), t.gradient_clip)))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {k: v.clone() for k, v in model.state_dict().items()}, norms


def test_the_one_sync_step_equals_a_plain_loop_bit_for_bit(tmp_path):
    steps = 5
    tr = _trainer(tmp_path, log_every_steps=1)
    norms = []
    tr.metrics.tensorboard = True
    tr.metrics.scalar = lambda tag, value, step: norms.append(value) if tag == "train/grad_norm" else None
    assert tr.train(stop_after_steps=steps) == "stopped"
    weights, ref_norms = _reference_run(steps, log_every_steps=1)
    assert norms == ref_norms  # the norm that rode in the all-reduce is the clip's own
    for key, value in tr.model.state_dict().items():
        assert torch.equal(value, weights[key]), key


def test_no_step_waits_for_the_device(tmp_path, monkeypatch):
    """Counts the Python-level reads of tensor values (each one a device sync on a GPU) while
    steps are queued, outside the optimizer (its CPU step counters; the GPU's fused AdamW reads
    none) and the checkpoint code between steps: none. Each step's sums are read once, in
    `_settle`, while the next step runs (read_lag 1 and the fused AdamW, as on a GPU)."""
    tr = _late(_trainer(tmp_path), fused=True)
    reads = {"n": 0, "on": True}
    for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, **kwargs):
            reads["n"] += reads["on"]
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)

    def paused(fn, calls=None):
        def run(*args, **kwargs):
            reads["on"] = False
            if calls is not None:
                calls.append(args)
            try:
                return fn(*args, **kwargs)
            finally:
                reads["on"] = True

        return run

    settled = []
    tr.step.optimizer.step = paused(tr.step.optimizer.step)
    tr._settle = paused(tr._settle, settled)
    tr._step_boundary = paused(tr._step_boundary)
    tr.metrics.banner = paused(tr.metrics.banner)
    tr._write_log = paused(tr._write_log)
    assert tr.train(stop_after_steps=4) == "stopped"
    assert reads["n"] == 0
    assert [flight.global_step for (flight,) in settled] == [1, 2, 3, 4]


def test_resume_restores_the_optimizers_own_kernel_flags(tmp_path):
    tr = _trainer(tmp_path)
    assert tr.train(stop_after_steps=1) == "stopped"
    state = load_checkpoint(latest_good_checkpoint(tmp_path))
    for group in state["optimizer"]["param_groups"]:  # as a checkpoint from a GPU run says
        group["fused"], group["foreach"] = True, False
    resumed = _trainer(tmp_path)
    built = [(g["fused"], g["foreach"]) for g in resumed.step.optimizer.param_groups]
    resumed.load_state_dict(state)
    assert [(g["fused"], g["foreach"]) for g in resumed.step.optimizer.param_groups] == built
    assert resumed.train(stop_after_steps=2) == "stopped"  # a CPU AdamW with fused=True would raise


# --------------------------------------------------------------------------- RNG of ranks added on resume


def test_ranks_added_on_resume_get_their_own_random_streams(tmp_path):
    cfg = _config()
    states = {}
    for rank in (0, 1, 2):
        seed_everything(cfg.training.seed)
        tr = _make_rank(tmp_path, cfg, rank)
        if rank == 0:
            saved = tr.state_dict()  # a checkpoint of a one-process run: no rng_per_rank
            saved["progress"]["global_step"] = 7
        tr.load_state_dict(saved)
        states[rank] = torch.get_rng_state()
    assert torch.equal(states[0], saved["rng"]["torch"])  # rank 0 continues the saved streams
    assert not torch.equal(states[1], states[0]) and not torch.equal(states[2], states[0])
    assert not torch.equal(states[1], states[2])
    tr = _make_rank(tmp_path, cfg, 1)
    tr.load_state_dict(saved)
    assert torch.equal(torch.get_rng_state(), states[1])  # and reproducibly so


def _make_rank(run_dir, cfg, rank):
    from common.training.trainer import Trainer

    model = MarketGPT(cfg.model, num_assets=2, num_categories=1)
    run = run_of(run_dir / f"r{rank}", cfg)
    return Trainer(cfg.training, model, WINDOWS, run, rank=rank, world_size=3, out=io.StringIO(), tensorboard=False)


# --------------------------------------------------------------------------- gradient checkpointing


def _step_model(
    gradient_checkpointing: bool, dropout: float = 0.1, vocab_size: int = 64
) -> tuple[MarketGPT, torch.Tensor, tuple]:
    cfg = ModelConfig(
        vocab_size=vocab_size,
        context_length=64,
        d_model=64,
        num_layers=4,
        num_heads=4,
        d_ff=256,
        dropout=dropout,
        asset_embed_dim=4,
        category_embed_dim=4,
    )
    seed_everything(3)
    model = MarketGPT(cfg)
    model.gradient_checkpointing = gradient_checkpointing
    x = torch.randint(3, 64, (8, 64))
    ids = torch.zeros(8, dtype=torch.long)
    return model, x, (x, ids, ids, x)


def test_gradient_checkpointing_gives_the_same_loss_and_gradients():
    results = []
    for on in (False, True):
        model, _, args = _step_model(on)
        torch.manual_seed(11)  # the same dropout masks; checkpoint replays them in the recompute
        _, loss = model(*args)
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert torch.equal(loss_a, loss_b)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, rtol=0, atol=1e-7, msg=name)


def _profiled_peak_bytes(model: MarketGPT, args: tuple, tmp_path, precision: str = "fp32") -> int:
    """Peak CPU memory of one forward + backward by torch's memory profiler (its timeline):
    what the step allocates (the gradients too), not the weights that were there before."""
    from torch.profiler import ProfilerActivity, profile

    from common.distributed.precision import autocast

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as p:
        with autocast(precision, torch.device("cpu")):
            logits, loss = model(*args)
        loss.backward()  # with the logits held, as the Trainer holds them for the accuracy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated for CUDA snapshots; the CPU has no other
        p.export_memory_timeline(str(tmp_path / "timeline.json"), device="cpu")
    _, sizes = json.loads((tmp_path / "timeline.json").read_text())
    return max(sum(s) for s in sizes)


def test_gradient_checkpointing_lowers_peak_memory_and_the_estimate_knows(tmp_path):
    peaks = {on: _profiled_peak_bytes(*_step_model(on)[::2], tmp_path) for on in (False, True)}
    assert peaks[True] < 0.7 * peaks[False], peaks
    model, x, _ = _step_model(False)
    estimates = {
        on: estimate_training_memory(model.config, model.num_parameters(), 8, "fp32", on).activations
        for on in (False, True)
    }
    assert estimates[True] < 0.7 * estimates[False]


# --------------------------------------------------------------------------- GPU health in the log


class _FakeNVML(types.ModuleType):
    NVML_TEMPERATURE_GPU = 0

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.handles = []

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.handles.append(uuid)
        return uuid

    def nvmlDeviceGetUtilizationRates(self, handle):
        return types.SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(used=31_500_000_000, total=80_000_000_000)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 64

    def nvmlDeviceGetPowerUsage(self, handle):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")  # a reading this card lacks


def _fake_gpu_memory(monkeypatch) -> None:
    props = types.SimpleNamespace(name="NVIDIA A100-SXM4-80GB", total_memory=80_000_000_000, uuid="1234-abcd")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: props)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 30_000_000_000)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: 35_100_000_000)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 36_000_000_000)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: None)


def test_gpu_stats_from_torch_and_a_fake_nvml(monkeypatch):
    _fake_gpu_memory(monkeypatch)
    nvml = _FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(gpu_health_mod, "_NVML", None)
    s = gpu_stats_mod.gpu_stats(torch.device("cuda", 0))
    assert nvml.handles == ["GPU-1234-abcd"]
    assert s == {
        "index": 0,
        "name": "NVIDIA A100-SXM4-80GB",
        "mem_total_gb": 80.0,
        "mem_allocated_gb": 30.0,
        "mem_peak_gb": 35.1,
        "mem_reserved_gb": 36.0,
        "util_pct": 97.0,
        "nvml_mem_used_gb": 31.5,
        "temperature_c": 64.0,
        "power_w": None,
    }
    assert gpu_stats_mod.gpu_stats(torch.device("cpu")) is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed: torch's numbers only
    monkeypatch.setattr(gpu_health_mod, "_NVML", None)
    s = gpu_stats_mod.gpu_stats(torch.device("cuda", 0))
    assert s["util_pct"] is None and s["mem_peak_gb"] == 35.1


def test_epochs_log_gpus_null_on_the_cpu_and_readings_on_a_gpu(tmp_path, monkeypatch):
    tr = _trainer(tmp_path / "cpu", epochs=1, max_steps_per_epoch=2)
    assert tr.train() == "finished"
    assert [e["gpus"] for e in json.loads((tmp_path / "cpu" / "training_log.json").read_text())["epochs"]] == [None]

    _fake_gpu_memory(monkeypatch)
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNVML())
    monkeypatch.setattr(gpu_health_mod, "_NVML", None)
    out = io.StringIO()
    tr = _trainer(tmp_path / "gpu", out=out, epochs=1, max_steps_per_epoch=2)
    tr.cuda = tr.metrics.cuda = True  # the epoch's readings as on GPU 0; the maths stays on the CPU
    real_device = tr.device
    monkeypatch.setattr(
        "common.training.telemetry.gpu_stats", lambda d: gpu_stats_mod.gpu_stats(torch.device("cuda", 0))
    )
    scalars = {}
    tr.metrics.tensorboard = True
    tr.metrics.scalar = lambda tag, value, step: scalars.__setitem__(tag, value)
    assert tr.train() == "finished" and tr.device == real_device
    (epoch,) = json.loads((tmp_path / "gpu" / "training_log.json").read_text())["epochs"]
    assert epoch["gpus"][0]["util_pct"] == 97.0 and epoch["gpus"][0]["mem_peak_gb"] == 35.1
    assert scalars["gpu0/util_pct"] == 97.0 and scalars["gpu0/temperature_c"] == 64.0
    assert (
        "GPU 0 (rank 0) NVIDIA A100-SXM4-80GB: util 97% | mem 30.0 GB, peak 35.1 of 80.0 GB | card 31.5 GB used | 64 C"
    ) in out.getvalue()


# --------------------------------------------------------------------------- marketgpt doctor


def _fake_node(monkeypatch, tmp_path, names, memory=80e9, capability=(9, 0)) -> None:
    _fake_cuda(monkeypatch, names=names, capability=capability)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 27, 3))
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda d=None: types.SimpleNamespace(name=names[d.index], total_memory=int(memory)),
    )
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir(exist_ok=True)
    smi.write_text("#!/bin/sh\necho 570.124.06\necho 570.124.06\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:/usr/bin:/bin")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SUBMITIT_EXECUTOR", "SLURM_STEP_ID", "SLURM_STEPID"):
        monkeypatch.delenv(key, raising=False)


def test_doctor_on_a_cpu_only_machine_exits_1_naming_the_cause(capsys, monkeypatch):
    from common.cli import main

    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "built for CUDA none (CPU build)" in out and "GPUs visible to torch: 0" in out
    assert out.strip().splitlines()[-1].startswith("PROBLEM: training here would run on the CPU: this torch")
    for caps, answer in (({"avx512_bf16": True}, "bf16 in hardware: yes"), ({"avx2": True}, "bf16 in hardware: no")):
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda caps=caps: caps)
        assert main(["doctor"]) == 1
        assert answer in capsys.readouterr().out


def test_doctor_on_a_two_gpu_slurm_node(monkeypatch, tmp_path, capsys):
    from common.cli import main

    _fake_node(monkeypatch, tmp_path, ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"))
    for key, value in SLURM_2_GPUS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(precision, "_triton_installed", lambda: True)
    monkeypatch.setenv("CC", "gcc")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "torch.compile (training.compile, on in the case configs): ready (Triton and a C compiler)" in out
    assert "torch " in out and "built for CUDA 12.8 | NCCL 2.27.3" in out and "NVIDIA driver: 570.124.06" in out
    assert (
        "  GPU 1: NVIDIA H100 PCIe, 80.0 GB, compute capability 9.0, bf16 yes, peak 756.5 TFLOP/s dense bf16, "
        "training.precision=auto -> bf16"
    ) in out
    assert "SLURM_GPUS_ON_NODE=2" in out and "SLURM_JOB_ID=77" in out
    case_lines = [line for line in out.splitlines() if "/configs/" in line]
    configs = sorted(REPO_ROOT.glob("case_*/configs/*.json"))  # the seed configs and the documented examples
    assert len(case_lines) == len(configs) >= 3 and all(line.endswith(": fits") for line in case_lines)
    assert out.strip().splitlines()[-1] == "OK: training here uses 2 GPU(s)"


def test_compile_problem_names_what_the_node_lacks(monkeypatch):
    """training.compile needs Triton and a C compiler; without either the Trainer trains eagerly
    and doctor says why (an H100 run measured compile at +26% tokens/s on case A)."""
    monkeypatch.setattr(precision, "_triton_installed", lambda: True)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(precision.shutil, "which", lambda name: None)
    assert "no C compiler on PATH" in precision.compile_problem()
    monkeypatch.setenv("CC", "/opt/gcc/bin/gcc")
    assert precision.compile_problem() is None
    monkeypatch.setattr(precision, "_triton_installed", lambda: False)
    assert "Triton is not installed" in precision.compile_problem()


def test_compile_mode_replays_cuda_graphs_on_one_gpu_only():
    """training.compile_mode: "auto" is CUDA graphs (reduce-overhead) on one GPU, plain compile
    under DDP or gradient checkpointing; an explicit CUDA-graph mode there falls back with a note."""
    choose = precision.choose_compile_mode
    assert choose("auto", 1, False) == ("reduce-overhead", None)
    assert choose("auto", 2, False) == ("default", None)
    assert choose("auto", 1, True) == ("default", None)
    assert choose("default", 1, False) == ("default", None)
    assert choose("max-autotune-no-cudagraphs", 4, False) == ("max-autotune-no-cudagraphs", None)
    mode, note = choose("reduce-overhead", 2, False)
    assert mode == "default" and "under DDP" in note and "training.compile_mode=reduce-overhead" in note
    mode, note = choose("max-autotune", 1, True)
    assert mode == "max-autotune-no-cudagraphs" and "gradient checkpointing" in note
    with pytest.raises(ValueError, match="unknown compile mode"):
        choose("fast", 1, False)


def test_the_cpu_trainer_compiles_nothing_and_reads_each_step_at_once(tmp_path):
    from common.config import apply_overrides

    tr = _trainer(tmp_path, compile=True, compile_mode="reduce-overhead", overlap_host=True)
    assert (tr.step.compiled, tr.step.cuda_graphs, tr.read_lag) == (False, False, 0)
    with pytest.raises(UserError, match="compile_mode"):
        apply_overrides(_config(), ['training.compile_mode="fastest"'], "--set")


def test_doctor_flags_a_gpu_too_small_and_more_ranks_than_gpus(monkeypatch, tmp_path, capsys):
    from common.cli import main

    _fake_node(monkeypatch, tmp_path, ("Tesla T4",), memory=4e9, capability=(7, 5))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun --nproc-per-node 2 on one GPU
    monkeypatch.setattr(precision, "_triton_installed", lambda: False)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert (
        "torch.compile (training.compile, on in the case configs): UNAVAILABLE, training falls back to eager: "
        "Triton is not installed" in out
    )
    assert "bf16 no, peak 65 TFLOP/s dense fp16, training.precision=auto -> fp16" in out
    assert any("case_a_full_market" in line and "does NOT fit" in line for line in out.splitlines())
    assert "PROBLEM: this node runs 2 processes of the job but rank 0 (local rank 0) sees 1 GPU(s)" in out


def test_status_shows_each_gpus_peak_memory(tmp_path, monkeypatch):
    from common.cluster import status

    monkeypatch.setattr(status, "slurm_available", lambda: False)
    epoch = {"epoch": 1, "val_loss": 2.0, "tokens_per_sec": 5e4, "eta_s": 60.0}
    for name, gpus in (("gpu_run", [{"mem_peak_gb": 35.14}, {"mem_peak_gb": 34.8}]), ("cpu_run", None)):
        run = tmp_path / "case_c_crypto" / "checkpoints" / name
        run.mkdir(parents=True)
        (run / "config.json").write_text(json.dumps({"training": {"epochs": 5}}))
        (run / "training_log.json").write_text(json.dumps({"status": "running", "epochs": [{**epoch, "gpus": gpus}]}))
    header, cpu_row, gpu_row = status.status_table(root=tmp_path).splitlines()
    column = header.index("PEAK MEM")
    assert gpu_row[column:].split()[0] == "35.1/34.8G"
    assert cpu_row[column:].split()[0] == "-"


# --------------------------------------------------------------------------- the final test scoring

_SCORING = """
import sys, time
from common.distributed.ddp import init_distributed, shutdown
from common.distributed.job_store import wait_for_main
env, _ = init_distributed()
if env.is_main:
    print("scoring", time.time(), flush=True)
    time.sleep(3)  # rank 0 scores the test split
    if sys.argv[1] == "dies":
        import os; os._exit(9)
    print("scored", time.time(), flush=True)
wait_for_main("final outputs")
print("left", time.time(), flush=True)
shutdown()
"""


@pytest.mark.enable_socket
@pytest.mark.parametrize("how", ["scores", "dies"])
def test_other_ranks_wait_for_rank_0s_final_scoring(how):
    from ddp_helpers import start_ranks

    ranks = start_ranks(2, [sys.executable, "-c", _SCORING, how])
    outs = [p.communicate(timeout=120) for p in ranks]
    times = [{line.split()[0]: float(line.split()[1]) for line in out.splitlines()} for out, _ in outs]
    if how == "scores":
        assert [p.returncode for p in ranks] == [0, 0], outs
        assert times[1]["left"] >= times[0]["scored"]  # rank 1 left only after rank 0 had scored
    else:  # rank 0 died while scoring: rank 1 stops with an error instead of waiting for ever
        assert ranks[0].returncode == 9 and ranks[1].returncode != 0
        assert "left" not in times[1] and "rank 0 ended while this rank waited for its final outputs" in outs[1][1]


# --------------------------------------------------------------------------- bench/bench_gpu.py


def test_bench_gpu_runs_its_step_and_writes_json_with_the_device(tmp_path):
    import subprocess

    from common.paths import REPO_ROOT

    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "bench" / "bench_gpu.py"),
            "--device",
            "cpu",
            "--smoke",
            "--cases",
            "C",
            "--threads",
            "1",
            "--json",
            str(out),
            "--profile",
            str(tmp_path / "prof"),
            "--set",
            "model.dropout=0.0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "GPU training, case C, fp32, eager  tokens/s" in proc.stdout
    result = json.loads(out.read_text())
    assert result["figures"]["device"] == "cpu"
    (run,) = result["figures"]["cases"]["C"]["runs"]
    assert run["tokens_per_sec"] > 0 and run["estimate_bytes"] > 0 and run["mfu"] is None  # no peak for a CPU
    assert result["figures"]["set"] == ["model.dropout=0.0"]
    assert "aten::mm" in (tmp_path / "prof" / "profile_C_eager.txt").read_text()  # the profiler's table


def test_bench_gpu_trainer_times_the_trainer_beside_the_bare_step(tmp_path):
    """bench_gpu_trainer on the CPU at toy size: the bare step, then the real Trainer reading its
    steps late and at once (two train() calls on one Trainer); the GPU-only figures stay None."""
    import subprocess

    from common.paths import REPO_ROOT

    out = tmp_path / "trainer.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "bench" / "bench_gpu_trainer.py"),
            "--device",
            "cpu",
            "--smoke",
            "--cases",
            "C",
            "--threads",
            "1",
            "--json",
            str(out),
            "--host-profile",
            str(tmp_path / "host"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "50 Trainer steps" in (tmp_path / "host" / "host_C.txt").read_text()  # cProfile's table
    assert "_step" in (tmp_path / "host" / "host_C.txt").read_text()
    case = json.loads(out.read_text())["figures"]["cases"]["C"]
    assert "error" not in case, case
    tr = case["trainer"]
    assert case["bench"]["tokens_per_sec"] > 0 and tr["tokens_per_sec"] > 0 and tr["tokens_per_sec_read_at_once"] > 0
    assert case["trainer_over_bench"] == tr["tokens_per_sec"] / case["bench"]["tokens_per_sec"]
    assert tr["gpu_busy_share"] is None and tr["syncs"] is None and tr["cuda_graphs"] is False
    assert "Trainer vs bench, case C" in proc.stdout


def test_bench_gpu_largest_batch_search(monkeypatch):
    from common.paths import REPO_ROOT

    monkeypatch.syspath_prepend(str(REPO_ROOT / "bench"))
    import bench_gpu

    tried = []
    monkeypatch.setattr(bench_gpu, "_fits", lambda cfg, device, batch: tried.append(batch) or batch <= 100)
    assert bench_gpu.largest_batch(None, torch.device("cpu"), 32, 4096) == 100
    assert tried[:3] == [32, 64, 128]  # doubling until out of memory, then bisection
    assert bench_gpu.largest_batch(None, torch.device("cpu"), 32, 48) == 48  # capped by the limit


@pytest.mark.parametrize(
    "precision, dropout, checkpointing",
    [("bf16", 0.1, False), ("bf16", 0.0, False), ("bf16", 0.1, True), ("fp32", 0.0, False), ("fp32", 0.1, True)],
)
def test_memory_estimate_matches_torchs_profiler_within_15_percent(tmp_path, precision, dropout, checkpointing):
    """CPU autocast keeps what CUDA autocast keeps (16-bit weight copies, fp32 residual stream
    and LayerNorm inputs), so the profiler checks the constants here; bench_gpu does on a GPU."""
    model, _, args = _step_model(checkpointing, dropout=dropout, vocab_size=256)
    measured = _profiled_peak_bytes(model, args, tmp_path, precision)
    est = estimate_training_memory(model.config, model.num_parameters(), 8, precision, checkpointing)
    expected = est.total - est.weights_optimizer + 4 * model.num_parameters()  # the step's part: grads, not weights
    assert 0.85 <= measured / expected <= 1.15, (measured, expected)


# --------------------------------------------------------------------------- tools/gpu_check.py


def test_gpu_check_runs_every_step_on_the_cpu_and_writes_its_summary(tmp_path, capsys):
    """The one command a GPU session runs (issue 12), at toy size on the CPU: the stopped and
    resumed training, the checkpoint on the CPU, and the first-step comparison (exact here)."""
    from common.paths import REPO_ROOT

    sys.path.insert(0, str(REPO_ROOT / "tools"))
    import gpu_check

    log = "  epoch 1/2 step 3/40 | loss 6.931 | lr 1e-04\nstep 4/40 | loss 6.5 |"
    assert gpu_check.step_losses(log) == [6.931, 6.5]
    out = tmp_path / "out"
    code = gpu_check.main(
        ["--out", str(out), "--device", "cpu", "--tiny", "--skip-bench", "--skip-scorecard", "--steps", "3"]
    )
    summary = json.loads((out / "summary.json").read_text())
    assert code == 0, summary
    assert summary["training"]["ok"] and summary["training"]["precision"] == "fp32"
    assert [e["epoch"] for e in summary["training"]["epochs"]] == [1, 2]
    first = summary["first_steps"]
    assert first["ok"] and len(first["losses"]["cpu"]) == 5 and first["max_relative_difference"] == 0.0
    assert {p.name for p in out.iterdir()} == {"doctor.txt", "train.log", "training_log.json", "summary.json"}
    assert "Resuming at epoch 2" in (out / "train.log").read_text()
