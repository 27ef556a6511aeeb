"""DistributedDataParallel on the CPU (gloo), with real processes started the way torchrun
starts them: the same weights and logged losses as one process with the combined batch, an
exact resume across a signal that reached one rank, loud and bounded failures naming the
failed rank, and --num-gpus checked against the job's layout. Plus the launcher detection."""

from __future__ import annotations

import json
import signal
import sys
import time

import pytest
import torch

from common.cli import main
from common.distributed.ddp import MultiGPUWrapper, unwrap
from common.distributed.env import (
    DistEnv,
    _first_slurm_host,
    _tasks_per_node,
    check_num_gpus,
    collective_timeout_s,
    detect_env,
)
from common.errors import UserError
from common.run.checkpoint import checkpoint_files, load_checkpoint

from ddp_helpers import (
    GLOBAL_BATCH,
    REPO,
    STEPS,
    assert_same_run,
    final_weights,
    logged_epochs,
    make_case,
    max_weight_difference,
    reference,
    run,
    run_dirs,
    start_ranks,
    train_command,
    wait_for_line,
)

pytestmark = pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")  # urllib3's IPv6 probe

# --------------------------------------------------------------------------- where am I


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, DistEnv()),
        (
            {
                "RANK": "3",
                "WORLD_SIZE": "4",
                "LOCAL_RANK": "1",
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "n1",
                "MASTER_PORT": "1234",
                "TORCHELASTIC_USE_AGENT_STORE": "True",
                "TORCHELASTIC_RESTART_COUNT": "2",
            },
            DistEnv(
                rank=3,
                world_size=4,
                local_rank=1,
                local_world_size=2,
                master_addr="n1",
                master_port=1234,
                launcher="torchrun",
                agent_store=True,
                attempt=2,
            ),
        ),
        (
            {
                "SLURM_PROCID": "3",
                "SLURM_STEP_ID": "0",
                "SLURM_NTASKS": "4",
                "SLURM_STEP_NUM_TASKS": "4",
                "SLURM_LOCALID": "1",
                "SLURM_NODEID": "1",
                "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
                "SLURM_STEP_NODELIST": "node[1-2]",
                "SLURM_JOB_ID": "1234",
                "SLURM_GPUS_ON_NODE": "2",
            },
            DistEnv(
                rank=3,
                world_size=4,
                local_rank=1,
                local_world_size=2,
                master_addr="node1",
                master_port=21234,
                launcher="slurm",
                gpus_on_node=2,
            ),
        ),
        (
            {
                "SLURM_PROCID": "0",
                "SLURM_STEP_ID": "0",
                "SLURM_NTASKS": "3",
                "SLURM_LOCALID": "0",
                "SLURM_NODEID": "1",
                "SLURM_TASKS_PER_NODE": "2,1",
                "SLURM_JOB_NODELIST": "gpu07",
                "SLURM_JOB_ID": "9",
                "MASTER_PORT": "4000",
                "SUBMITIT_EXECUTOR": "slurm",
            },
            DistEnv(
                rank=0,
                world_size=3,
                local_rank=0,
                local_world_size=1,
                master_addr="gpu07",
                master_port=4000,
                launcher="submitit",
            ),
        ),
        (
            {
                "SUBMITIT_EXECUTOR": "local",
                "SUBMITIT_LOCAL_NTASKS": "2",
                "SUBMITIT_LOCAL_GLOBALID": "1",
                "SUBMITIT_LOCAL_LOCALID": "1",
                "SUBMITIT_LOCAL_JOB_ID": "777",
            },
            DistEnv(rank=1, world_size=2, local_rank=1, local_world_size=2, master_port=20777, launcher="submitit"),
        ),
    ],
    ids=["single", "torchrun", "srun", "submitit-slurm", "submitit-local"],
)
def test_detect_env_reads_each_launcher(environ, expected):
    assert detect_env(environ) == expected


def test_the_batch_script_itself_is_one_plain_process():
    # sbatch's script sees SLURM_PROCID and SLURM_NTASKS=4 but is no srun task (no step id)
    env = detect_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "5", "SLURM_GPUS_ON_NODE": "2"})
    assert env.launcher == "single" and env.world_size == 1 and env.gpus_on_node == 2


def test_slurm_helpers_parse_slurms_compressed_lists():
    assert _tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert _tasks_per_node("4") == [4] and _tasks_per_node("") == []
    assert _first_slurm_host("a100-[65-66,70]") == "a100-65"
    assert _first_slurm_host("gpu3,gpu4") == "gpu3"


def test_num_gpus_must_match_the_processes_and_gpus_per_node():
    check_num_gpus(None, DistEnv())
    check_num_gpus(1, DistEnv())  # the seed's "--num-gpus 1 to test on a single GPU"
    check_num_gpus(2, DistEnv(rank=1, world_size=4, local_world_size=2, launcher="slurm", gpus_on_node=2))
    with pytest.raises(
        UserError,
        match=r"--num-gpus 2 but the job started 1 process\(es\) on this node "
        r"\(a single plain process\).*--ntasks-per-node=2.*--nproc-per-node=2",
    ):
        check_num_gpus(2, DistEnv())
    with pytest.raises(UserError, match=r"--num-gpus 4 but the job started 2 process\(es\) on this node \(slurm\)"):
        check_num_gpus(4, DistEnv(world_size=4, local_world_size=2, launcher="slurm", gpus_on_node=4))
    with pytest.raises(UserError, match=r"Slurm gave this node 4 GPU\(s\).*--gres=gpu:<type>:N"):
        check_num_gpus(2, DistEnv(world_size=2, local_world_size=2, launcher="slurm", gpus_on_node=4))
    with pytest.raises(UserError, match="at least 1"):
        check_num_gpus(0, DistEnv())


def test_the_collective_timeout_knob():
    assert collective_timeout_s({}) == 600
    assert collective_timeout_s({"MARKETGPT_DIST_TIMEOUT": "7.5"}) == 7.5
    with pytest.raises(UserError, match="MARKETGPT_DIST_TIMEOUT='soon' must be a positive number"):
        collective_timeout_s({"MARKETGPT_DIST_TIMEOUT": "soon"})


def test_in_one_process_the_wrapper_is_a_pass_through_that_checkpoints_unwrap():
    model = torch.nn.Linear(3, 2)
    wrapped = MultiGPUWrapper(model, num_gpus=1, env=DistEnv())
    assert wrapped.module is model and unwrap(wrapped) is model and wrapped.model is model
    assert unwrap(wrapped) is model
    with wrapped.no_sync():
        wrapped(torch.ones(1, 3)).sum().backward()
    assert model.weight.grad is not None


def test_num_gpus_mismatch_in_a_plain_process_is_one_clear_line(tmp_path, capsys):
    config = make_case(tmp_path)
    assert main(["train", "--config", str(config), "--num-gpus", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("marketgpt train: error: --num-gpus 2 but the job started 1 process")
    assert not run_dirs(config)  # checked before anything is written


# --------------------------------------------------------------------------- real processes


def _torchrun(*args: str) -> list[str]:
    # --standalone: a one-node rendezvous on a free loopback port that torchrun picks itself
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "common.cli",
        "train",
        *map(str, args),
    ]


@pytest.fixture(scope="module")
def torchrun_run(tmp_path_factory):
    """2 ranks under torchrun, each with half the reference's batch: the straight DDP run."""
    config = make_case(tmp_path_factory.mktemp("torchrun"))
    proc = run(
        _torchrun("--config", config, "--set", f"training.batch_size={GLOBAL_BATCH // 2}", "--num-gpus", "2"), expect=0
    )
    (run_dir,) = run_dirs(config)  # one folder: rank 0 named it, rank 1 followed
    return run_dir, proc


@pytest.mark.slow
def test_two_torchrun_ranks_learn_what_one_process_with_the_combined_batch_learns(torchrun_run):
    run_dir, proc = torchrun_run
    assert "DDP: 2 processes (gloo)" in proc.stdout
    effective = GLOBAL_BATCH * 2  # per-process batch x 2 processes x 2 accumulation steps
    assert (
        f"Effective batch size: {effective} ({GLOBAL_BATCH // 2} per process x 2 processes x 2 accumulation)"
        in proc.stdout
    )
    assert proc.stdout.count("Epoch 2/2") == 1 and proc.stdout.count("Test (best model") == 1  # rank 0 only
    log = json.loads((run_dir / "training_log.json").read_text())
    assert log["world_size"] == 2 and log["status"] == "finished" and log["effective_batch_size"] == effective
    assert (run_dir / "test_results.json").is_file()
    assert_same_run(run_dir, reference())
    # the check has teeth: one process with a rank's own batch (not the combined one) ends far away
    assert max_weight_difference(final_weights(run_dir), reference(GLOBAL_BATCH // 2)[0]) > 1e-3


@pytest.mark.slow
@pytest.mark.enable_socket
def test_a_signal_on_one_rank_stops_all_at_one_step_and_the_resume_is_exact(tmp_path):
    # 4 ranks, not 2: with 2 every gradient element's sum a + b is the same in any order, so a
    # resume that reduces in another order than the uninterrupted run would still look exact
    world = 4
    args = ("--set", f"training.batch_size={GLOBAL_BATCH // world}", "--resume", "auto")
    straight = make_case(tmp_path, "straight")
    ranks = start_ranks(world, train_command("--config", straight, *args))
    outs = [p.communicate(timeout=300) for p in ranks]
    assert [p.returncode for p in ranks] == [0] * world, outs
    config = make_case(tmp_path)
    ranks = start_ranks(world, train_command("--config", config, *args))
    wait_for_line(ranks[0], "epoch 1/2 step 5/")
    ranks[1].send_signal(signal.SIGUSR2)  # only rank 1 hears the time-limit warning
    outs = [p.communicate(timeout=120) for p in ranks]
    assert [p.returncode for p in ranks] == [75] * world, outs
    assert "Received SIGUSR2" in outs[0][0]
    (run_dir,) = run_dirs(config)
    saved = checkpoint_files(run_dir)[-1]
    state = load_checkpoint(saved)
    assert 5 <= state["progress"]["global_step"] < STEPS, saved.name  # stopped mid-run, all at this step
    assert len(state["rng_per_rank"]) == world

    ranks = start_ranks(world, train_command("--config", config, *args))
    outs = [p.communicate(timeout=300) for p in ranks]
    assert [p.returncode for p in ranks] == [0] * world, outs
    assert f"Resuming {run_dir} from {saved.name}" in outs[0][0]
    (straight_dir,) = run_dirs(straight)  # the same ranks, uninterrupted: bit for bit the same run
    assert max_weight_difference(final_weights(run_dir), final_weights(straight_dir)) == 0
    assert logged_epochs(run_dir) == logged_epochs(straight_dir)
    assert_same_run(run_dir, reference())


def _bounded_exit(proc, seconds: float) -> tuple[float, str]:
    """Seconds to exit and stderr. `seconds` is a hang guard far below the collective timeout a
    silent failure would wait for, never a speed check: past it the test fails as a hang."""
    start = time.monotonic()
    _, err = proc.communicate(timeout=seconds)
    return time.monotonic() - start, err


@pytest.mark.slow
@pytest.mark.enable_socket
# 3 ranks, the last killed: rank 0 names it, and rank 1 is a survivor that neither serves the store
# nor died (a 4th rank would be another such survivor)
@pytest.mark.parametrize("world, victim", [(3, 2), (2, 0)], ids=["3-ranks-kill-2", "2-ranks-kill-0"])
def test_killing_a_rank_stops_the_others_quickly_naming_it(tmp_path, world, victim):
    config = make_case(tmp_path, epochs=100)
    args = ("--config", config, "--set", f"training.batch_size={GLOBAL_BATCH // world}")
    ranks = start_ranks(world, train_command(*args))
    wait_for_line(ranks[0], "step 2/")
    ranks[victim].kill()
    errors = {}
    for r, proc in enumerate(ranks):
        if r != victim:  # a hang guard far below the 600 s collective timeout: the others stop on their own
            errors[r] = proc.communicate(timeout=90)[1].strip().splitlines()[-1]
            assert proc.returncode == 2, (r, errors[r])
    for r, last in errors.items():
        assert last.startswith(f"marketgpt train: error: rank {r} stops because "), last
        # a rank still blocked when rank 0 (and the store it serves) left can only say so
        assert f"rank {victim} " in last or "rank 0 is gone" in last, last
    if victim != 0:  # rank 0 serves the store: it always reads every report, so it names exactly the victim
        assert errors[0].startswith(
            f"marketgpt train: error: rank 0 stops because rank {victim} stopped without "
            "reporting an error (killed, out of memory, or its node was lost)"
        ), errors[0]
    else:
        assert all("rank 0 is gone" in last for last in errors.values()), errors


@pytest.mark.slow
@pytest.mark.enable_socket
def test_a_frozen_rank_stops_the_other_after_the_collective_timeout(tmp_path):
    config = make_case(tmp_path, epochs=100)
    ranks = start_ranks(
        2,
        train_command("--config", config, "--set", f"training.batch_size={GLOBAL_BATCH // 2}"),
        MARKETGPT_DIST_TIMEOUT="12",
    )
    try:
        wait_for_line(ranks[0], "step 2/")
        ranks[1].send_signal(signal.SIGSTOP)  # alive but stuck: only the timeout can tell
        took, err = _bounded_exit(ranks[0], 90)
    finally:
        ranks[1].kill()
        ranks[1].communicate()
    assert ranks[0].returncode == 2 and took >= 12, (took, err)  # it waited for the timeout
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("marketgpt train: error: rank 0 stops because rank 1 stopped without reporting an error")
    ), err


def _fault(tmp_path, rank: int, *stuck: str, survivor_s: float) -> tuple[float, str, str]:
    """Two ranks; `rank` raises after step 3 (the other blocks outside any collective with
    "--stuck"). Returns the survivor's seconds to exit, its stderr and the faulty rank's."""
    config = make_case(tmp_path, epochs=100)
    ranks = start_ranks(
        2,
        [
            sys.executable,
            str(REPO / "tests" / "ddp_helpers.py"),
            "fault",
            str(rank),
            "3",
            *stuck,
            "--",
            "--config",
            str(config),
            "--set",
            f"training.batch_size={GLOBAL_BATCH // 2}",
        ],
    )
    faulty, survivor = ranks[rank], ranks[1 - rank]
    took, err = _bounded_exit(survivor, survivor_s)
    _, faulty_err = faulty.communicate(timeout=60)
    assert f"RuntimeError: injected fault on rank {rank} at step 3" in faulty_err and faulty.returncode != 0
    assert survivor.returncode == 2, (took, err)
    return took, err, faulty_err


@pytest.mark.slow
@pytest.mark.enable_socket
def test_a_rank_that_raises_is_named_by_the_others(tmp_path):
    _, err0, _ = _fault(tmp_path, 1, survivor_s=90)
    assert err0.strip().splitlines()[-1] == (
        "marketgpt train: error: rank 0 stops because rank 1 failed with RuntimeError: injected fault on rank 1 "
        "at step 3; see that rank's log for the cause, then resume with --resume auto"
    )


@pytest.mark.slow
@pytest.mark.enable_socket
def test_a_rank_stuck_outside_collectives_is_stopped_by_the_watchdog_naming_the_rank_that_raised(tmp_path):
    # what NCCL does to the survivors of a rank that raised: no error reaches them, they wait
    _, err0, _ = _fault(tmp_path, 1, "--stuck", survivor_s=90)
    assert err0.strip().splitlines()[-1] == (
        "error: rank 0 stops because rank 1 failed with RuntimeError: injected fault on rank 1 at step 3 (this "
        "rank was still waiting for it 15 s later); see that rank's log for the cause, then resume with "
        "--resume auto"
    )


@pytest.mark.slow
@pytest.mark.enable_socket
def test_when_rank_0_raises_it_keeps_the_store_up_until_the_others_have_read_why(tmp_path):
    _, err1, _ = _fault(tmp_path, 0, survivor_s=90)
    assert "rank 1 stops because rank 0 failed with RuntimeError: injected fault on rank 0 at step 3" in err1


@pytest.mark.slow
@pytest.mark.enable_socket
def test_num_gpus_that_disagrees_with_torchrun_stops_every_rank(tmp_path):
    # each rank checks before any rendezvous, so each must say why on its own; started with
    # torchrun's environment rather than by torchrun, which kills the others once one exits
    config = make_case(tmp_path)
    ranks = start_ranks(2, train_command("--config", config, "--num-gpus", "1"))
    for rank in ranks:
        _, err = rank.communicate(timeout=120)
        assert rank.returncode == 2, err
        assert (
            err.strip()
            .splitlines()[-1]
            .startswith(
                "marketgpt train: error: --num-gpus 1 but the job started 2 process(es) on this node (torchrun)"
            )
        ), err
    assert not run_dirs(config)


@pytest.mark.enable_socket
def test_no_sync_skips_the_gradient_all_reduce_until_the_last_micro_step():
    script = """
import torch
from common.distributed.ddp import MultiGPUWrapper, all_gather_objects, init_distributed, unwrap
env, _ = init_distributed()
torch.manual_seed(env.rank)  # different weights per rank: DDP starts every rank from rank 0's
model = MultiGPUWrapper(torch.nn.Linear(4, 1, bias=False), num_gpus=2)
w = all_gather_objects(unwrap(model).weight.detach().clone())
assert torch.equal(w[0], w[1])
x = torch.full((1, 4), float(env.rank + 1))
with model.no_sync():
    model(x).sum().backward()
g = all_gather_objects(unwrap(model).weight.grad.clone())
assert g[0][0, 0] == 1 and g[1][0, 0] == 2, g  # still each rank's own
model(x).sum().backward()
g = all_gather_objects(unwrap(model).weight.grad.clone())
assert torch.equal(g[0], g[1]) and g[0][0, 0] == 3, g  # the mean of (1 + 1) and (2 + 2)
print("ok", env.rank)
"""
    ranks = start_ranks(2, [sys.executable, "-c", script])
    outs = [p.communicate(timeout=120) for p in ranks]
    assert [p.returncode for p in ranks] == [0, 0], outs
    assert outs[0][0].strip() == "ok 0" and outs[1][0].strip() == "ok 1"
