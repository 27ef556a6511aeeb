"""One process per GPU: where this process sits in the job, and the DDP plumbing around it.

`detect_env()` (common.distributed.env) reads the launcher's environment (srun under Slurm,
torchrun, submitit, or a plain single process), `init_distributed()` starts torch.distributed
on it (NCCL on CUDA, gloo on CPU) and binds this rank's GPU, and `MultiGPUWrapper` is the seed guide's name for the
DistributedDataParallel-wrapped model. The helpers below turn per-rank numbers into global
ones, so every logged figure is the whole job's.

Failures are loud and bounded. Every collective waits at most MARKETGPT_DIST_TIMEOUT seconds
(default 600). A rank that raises posts its error to the job's key-value store before it
exits, and every rank bumps a heartbeat counter there each second. When a collective fails on
a rank (a peer's sockets closed, or the timeout hit), `failures_reported()` reads the posts
for a few seconds and raises `RankFailed` naming the rank that raised, or the one whose
heartbeat stopped without a word (killed, out of memory, node lost). The store lives on
rank 0 (or in torchrun's agent): a rank that loses rank 0 can only say so.

NCCL doesn't raise in Python when a peer leaves: the survivor's next device sync just waits
(until the timeout, when NCCL's watchdog aborts the process). So the heartbeat thread also
watches the posts: a rank still running 15 s after a peer posted its error prints that error
and exits (code 2). A peer killed without a word (OOM killer, kill -9) still costs an NCCL job
the full timeout: lower MARKETGPT_DIST_TIMEOUT to bound it.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import inspect
import json
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from common.distributed.env import DistEnv, check_num_gpus, collective_timeout_s, detect_env, rank_device
from common.errors import UserError

__all__ = [
    "MultiGPUWrapper",
    "RankFailed",
    "all_gather_objects",
    "all_reduce_sum",
    "any_rank",
    "barrier",
    "before_abort",
    "failures_reported",
    "init_distributed",
    "share_from_main",
    "shutdown",
    "unwrap",
    "wait_for_main",
]

_REPORT_WAIT_S = 5.0  # how long a rank that lost a peer waits for the others' error reports
_LINGER_S = 2.0  # rank 0 keeps serving the store this much longer, for ranks that noticed later
_HEARTBEAT_S = 1.0  # each rank's sign of life in the store (see _start_heartbeat)
_RAISED = "raised "  # prefix of a rank's posted status when it failed with an exception
_WATCHDOG_S = 15.0  # a peer raised this long ago and this rank still runs: it is stuck (NCCL)


class RankFailed(UserError):
    """Another rank of the job failed; this one stops too (the message names the failed rank)."""


# --------------------------------------------------------------------------- the process group

_STORE: Optional[dist.Store] = None  # the job's key-value store: error reports, rank 0's decisions
_ENV: Optional[DistEnv] = None
_DEVICE = torch.device("cpu")  # where collective helper tensors live (CUDA under NCCL)
_HEARTBEAT: Optional[tuple[threading.Event, threading.Thread]] = None
_WAS_DISTRIBUTED = False  # this process joined a process group (see common.cli.entry)
_BEFORE_ABORT: list[Callable[[], Any]] = []  # what the watchdog finishes before os._exit


def was_distributed() -> bool:
    return _WAS_DISTRIBUTED


def init_distributed(env: Optional[DistEnv] = None, timeout_s: Optional[float] = None, device_setting: str = "auto"
                     ) -> tuple[DistEnv, torch.device]:
    """Start torch.distributed for this rank and pick its device.

    Each rank binds the GPU of its local rank. `timeout_s` (default MARKETGPT_DIST_TIMEOUT)
    bounds the rendezvous and every collective. `device_setting` is training.device.
    """
    global _STORE, _ENV, _DEVICE, _WAS_DISTRIBUTED
    env = env or detect_env()
    device = rank_device(env, device_setting)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if env.distributed and not dist.is_initialized():
        timeout = datetime.timedelta(seconds=timeout_s or collective_timeout_s())
        # Surface NCCL failures as errors on every rank rather than silent hangs.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        # torchrun's agent already serves the store at MASTER_PORT; otherwise rank 0 serves it.
        host = env.rank == 0 and not env.agent_store
        try:
            store = dist.TCPStore(env.master_addr, env.master_port, env.world_size, is_master=host,
                                  timeout=timeout, wait_for_workers=False)
        except (RuntimeError, OSError) as e:
            raise UserError(f"rank {env.rank}: cannot reach the rendezvous at {env.master_addr}:{env.master_port} "
                            f"({str(e).splitlines()[0]}); is the port free and the first node reachable? "
                            "(set MASTER_PORT to pick another port)") from None
        try:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=env.rank,
                                    world_size=env.world_size, timeout=timeout,
                                    device_id=device if device.type == "cuda" else None)
        except (RuntimeError, OSError) as e:  # some rank never arrived, or died on the way
            raise RankFailed(f"rank {env.rank}: not all {env.world_size} ranks joined at {env.master_addr}:"
                             f"{env.master_port} within {timeout.total_seconds():g} s "
                             f"({str(e).splitlines()[0][:200]}); see the other ranks' logs") from None
        _STORE, _ENV, _DEVICE = store, env, device
        _WAS_DISTRIBUTED = True
        _start_heartbeat(env, timeout)
    return env, device


def _start_heartbeat(env: DistEnv, timeout: datetime.timedelta) -> None:
    """Bump heartbeat/<rank> in the store every second from a daemon thread (on its own store
    connection), so a rank that lost a peer can tell a dead rank (its count stopped) from one
    that is merely blocked in the same broken collective. The same thread is the watchdog for
    a peer that raised (see _stop_stuck_rank)."""
    global _HEARTBEAT
    client = dist.TCPStore(env.master_addr, env.master_port, is_master=False, timeout=timeout)
    stop = threading.Event()
    key = _key(f"heartbeat/{env.rank}", env)

    def beat() -> None:
        raised_since = None
        while not stop.wait(_HEARTBEAT_S):
            try:
                client.add(key, 1)
                raised = _raised_peers(client, env)
            except Exception:  # the store is gone: the job is ending
                return
            if raised and raised_since is None:
                raised_since = time.monotonic()
            if raised_since is not None and time.monotonic() - raised_since >= _WATCHDOG_S and not stop.is_set():
                _stop_stuck_rank(env, raised, client)

    thread = threading.Thread(target=beat, name="marketgpt-heartbeat", daemon=True)
    thread.start()
    _HEARTBEAT = (stop, thread)
    # A process that ends without calling shutdown() (a script, an exception) still stops the
    # heartbeat and destroys the process group before the interpreter tears down: left to the
    # C++ destructors, gloo's and the store's threads abort it ("terminate called ...", 134).
    atexit.register(shutdown)


def before_abort(finish: Callable[[], Any]) -> None:
    """Have the watchdog run `finish` before it ends this process (see _stop_stuck_rank)."""
    _BEFORE_ABORT.append(finish)


def _raised_peers(client: dist.Store, env: DistEnv) -> dict[int, str]:
    """rank -> its error, for the other ranks that posted one."""
    return _errors(_statuses(client, env, [r for r in range(env.world_size) if r != env.rank]))


def _stop_stuck_rank(env: DistEnv, raised: dict[int, str], client: dist.Store) -> None:
    """A peer raised _WATCHDOG_S ago and this rank is still running: its main thread waits for
    that peer somewhere no error reaches it (NCCL's collectives don't raise in Python when a
    peer leaves; a device sync just waits, up to MARKETGPT_DIST_TIMEOUT). Say why and leave."""
    culprits = "; ".join(f"rank {r} failed with {msg}" for r, msg in sorted(raised.items()))
    for finish in _BEFORE_ABORT:  # e.g. a checkpoint still being written: don't lose it
        try:
            finish()
        except Exception:
            pass
    _post("lost a peer", client, env)  # rank 0 may wait for this
    if env.is_main and not env.agent_store:
        time.sleep(_LINGER_S)  # rank 0 serves the store: let the other stuck ranks read it too
    sys.stdout.flush()
    print(f"error: rank {env.rank} stops because {culprits} (this rank was still waiting for it "
          f"{_WATCHDOG_S:g} s later); see that rank's log for the cause, then resume with --resume auto",
          file=sys.stderr, flush=True)
    os._exit(2)  # the main thread is stuck in C++: nothing can raise into it


def _stop_heartbeat() -> None:
    if _HEARTBEAT is not None:
        stop, thread = _HEARTBEAT
        stop.set()
        thread.join(timeout=2 * _HEARTBEAT_S)


def shutdown() -> None:
    global _STORE, _ENV, _HEARTBEAT
    _stop_heartbeat()
    if _STORE is not None and _ENV is not None:
        # "finished", unless this rank already posted how it ended: a rank 0 that raised then
        # need not keep the store up for this one (_serve_until_read)
        try:
            if _store_alive() and not _STORE.check([_key(f"status/{_ENV.rank}")]):
                _post("finished")
        except Exception:
            pass
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _STORE = _ENV = _HEARTBEAT = None


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all ranks in place (a no-op in a single process); returns it."""
    if _active():
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def any_rank(flag: bool) -> bool:
    """True on every rank if it is true on any rank (e.g. a checkpoint signal that reached one)."""
    if not _active():
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=_DEVICE)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (a one-element list in a single process)."""
    if not _active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if _active():
        dist.barrier()


def _key(name: str, env: Optional[DistEnv] = None) -> str:
    env = env or _ENV
    return f"marketgpt/{env.attempt if env else 0}/{name}"


def share_from_main(name: str, value: Any = None) -> Any:
    """Rank 0's JSON-able `value` on every rank (rank 0 decides: the run folder, a resume).

    Goes through the store rather than a collective, so the other ranks may wait the whole
    timeout while rank 0 prepares data; if rank 0 dies meanwhile, the wait fails at once.
    """
    if not _active():
        return value
    if _STORE is None or _ENV is None:  # torch.distributed was started elsewhere: a collective instead
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    key = _key(f"shared/{name}")
    if _ENV.is_main:
        _STORE.set(key, json.dumps(value))
        return value
    _STORE.wait([key], datetime.timedelta(seconds=collective_timeout_s()))
    return json.loads(_STORE.get(key))


def wait_for_main(name: str, poll_s: float = 0.5, ack_s: float = 30.0) -> None:
    """Hold the other ranks, with no time limit, until rank 0 is done with `name` (its final
    test scoring): srun ends a step's remaining tasks WaitTime seconds after the first one
    exits, so ranks that left early would get rank 0 killed mid-evaluation. A rank 0 that
    raises (the watchdog, failures_reported) or dies (its store goes) ends the wait with an
    error. Rank 0 then waits up to `ack_s` for the others to have seen it: it serves the store."""
    if not _active() or _STORE is None or _ENV is None:
        return
    done, seen = _key(f"done/{name}"), _key(f"done/{name}/seen")
    if _ENV.is_main:
        _STORE.set(done, "1")
        deadline = time.monotonic() + ack_s
        while _STORE.add(seen, 0) < _ENV.world_size - 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        return
    try:
        while not _STORE.check([done]):
            time.sleep(poll_s)
        _STORE.add(seen, 1)
    except (RuntimeError, dist.DistError) as e:
        raise RankFailed(f"rank {_ENV.rank}: rank 0 ended while this rank waited for its {name} "
                         f"({str(e).splitlines()[0][:200]}); see rank 0's log") from None


# --------------------------------------------------------------------------- failures


def _is_comm_error(e: BaseException) -> bool:
    # gloo raises a plain RuntimeError ("Connection closed by peer", "Timed out"); the store
    # and NCCL raise torch.distributed.DistError subclasses.
    if isinstance(e, dist.DistError):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and any(s in text for s in ("gloo", "NCCL", "c10d", "Connection closed"))


def _store_alive() -> bool:
    """Whether the store still answers. Checked with a plain connect first, because a store
    call to a dead host dumps a C++ stack trace into the log before it raises."""
    assert _ENV is not None
    if _ENV.is_main or _ENV.agent_store:  # rank 0 serves it; torchrun's agent outlives its ranks
        return True
    try:
        socket.create_connection((_ENV.master_addr, _ENV.master_port), timeout=5).close()
        return True
    except OSError:
        return False


def _post(status: str, store: Optional[dist.Store] = None, env: Optional[DistEnv] = None) -> bool:
    """Tell the other ranks how this one ended ("raised ...", "lost a peer", "finished");
    False if the store is gone."""
    env = env or _ENV
    try:
        (store or _STORE).set(_key(f"status/{env.rank}", env), status)
        return True
    except Exception:  # the store died with its host: nothing to tell anyone
        return False


def _statuses(store: dist.Store, env: DistEnv, ranks: Sequence[int]) -> dict[int, str]:
    """rank -> how it ended, for those of `ranks` that posted it."""
    keys = {r: _key(f"status/{r}", env) for r in ranks}
    return {r: store.get(key).decode() for r, key in keys.items() if store.check([key])}


def _errors(statuses: Mapping[int, str]) -> dict[int, str]:
    """rank -> its error message, for the ranks that raised."""
    return {r: s[len(_RAISED):] for r, s in statuses.items() if s.startswith(_RAISED)}


def _reports(wait_s: float) -> Optional[tuple[dict[int, str], set[int]]]:
    """(rank -> posted status, ranks whose heartbeat stopped) after waiting up to `wait_s`
    for every rank to post; None if the store is gone."""
    assert _STORE is not None and _ENV is not None
    ranks = range(_ENV.world_size)
    deadline = time.monotonic() + wait_s
    try:
        beats = [_STORE.add(_key(f"heartbeat/{r}"), 0) for r in ranks]
        while True:
            found = _statuses(_STORE, _ENV, ranks)
            if len(found) == _ENV.world_size or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        stalled = {r for r in ranks if r not in found and _STORE.add(_key(f"heartbeat/{r}"), 0) == beats[r]}
    except Exception:
        return None
    return found, stalled


def _culprits(reports: Optional[tuple[dict[int, str], set[int]]], error: BaseException) -> str:
    """Who failed, from the ranks' reports and heartbeats (None: the store itself is gone)."""
    assert _ENV is not None

    def ranks(rs: Sequence[int]) -> str:
        return f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}"

    if reports is None:
        if _ENV.agent_store:
            return "torchrun's store is gone (the launcher is shutting the job down after a failure)"
        return ("rank 0 is gone, and with it the job's store (rank 0 failed, or stopped after another rank "
                "failed: its own message names the cause)")
    posted, stalled = reports
    raised = _errors(posted)
    parts = [f"rank {r} failed with {msg}" for r, msg in sorted(raised.items())]
    if stalled:
        parts.append(f"{ranks(sorted(stalled))} stopped without reporting an error (killed, out of memory, "
                     "or its node was lost)")
    hung = sorted(r for r in range(_ENV.world_size) if r not in posted and r not in stalled)
    if not parts and hung:  # alive, yet not in the collective: stuck elsewhere
        parts.append(f"{ranks(hung)} stopped taking part (still running: hung, or far slower than the others)")
    if not parts:  # every rank saw the same collective fail: the network, or a timeout everywhere
        parts.append(f"a collective failed on every rank ({str(error).splitlines()[0][:200]})")
    return "; ".join(parts)


@contextlib.contextmanager
def failures_reported(wait_s: float = _REPORT_WAIT_S) -> Iterator[None]:
    """Around a rank's work: post this rank's own error for the others, and turn a failed
    collective (a peer died or raised) into RankFailed naming the rank that failed."""
    try:
        yield
    except BaseException as e:
        if _STORE is None or _ENV is None:
            raise
        if not _is_comm_error(e):
            _stop_heartbeat()  # this rank's own post below says how it ended
            first = (str(e).splitlines() or [""])[0][:300]
            if _store_alive():
                _post(f"{_RAISED}{type(e).__name__}: {first}" if first else f"{_RAISED}{type(e).__name__}")
                if _ENV.is_main and not _ENV.agent_store:
                    _serve_until_read()
            raise
        # srun --kill-on-bad-exit and torchrun SIGTERM the survivors as soon as one rank fails:
        # hold that off for these few seconds, so the reports can be read and the cause printed.
        with _sigterm_deferred():
            posted = _store_alive() and _post("lost a peer")
            _stop_heartbeat()
            reports = _reports(wait_s) if posted else None
            if _ENV.is_main and not _ENV.agent_store:
                time.sleep(_LINGER_S)  # rank 0 serves the store: let the others finish reading it
        raise RankFailed(f"rank {_ENV.rank} stops because {_culprits(reports, e)}; see that rank's log for "
                         "the cause, then resume with --resume auto") from e


def _serve_until_read() -> None:
    """Rank 0 raised and serves the store: keep it up until every other rank has posted how it
    ended (they read this rank's error first), or their watchdogs have had time to read it."""
    deadline = time.monotonic() + _WATCHDOG_S + 3 * _HEARTBEAT_S
    others = range(1, _ENV.world_size)
    with _sigterm_deferred():
        while time.monotonic() < deadline and len(_statuses(_STORE, _ENV, others)) < len(others):
            time.sleep(0.2)
        time.sleep(_LINGER_S)  # the last of them may still be reading


@contextlib.contextmanager
def _sigterm_deferred() -> Iterator[None]:
    """SIGTERM is noted, not fatal, inside the block (the caller exits right after it anyway)."""
    try:
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------- the model wrapper


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model under MultiGPUWrapper, DDP, DataParallel and torch.compile wrappers."""
    while True:
        if isinstance(model, (MultiGPUWrapper, nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model


class MultiGPUWrapper(nn.Module):
    """The seed guide's wrapper, built on DistributedDataParallel (one process per GPU).

    `MultiGPUWrapper(model, num_gpus=2)` moves the model to this rank's device and wraps it
    in DDP when the job has more than one rank (starting torch.distributed if nobody has);
    in a single process it is a transparent pass-through. `num_gpus`, when given, must match
    the job's layout (see `check_num_gpus`), so a script asking for 2 GPUs never silently
    trains on 1. Checkpoints store `unwrap(model)`, the plain model.
    """

    def __init__(self, model: nn.Module, num_gpus: Optional[int] = None, env: Optional[DistEnv] = None,
                 device: Optional[torch.device] = None) -> None:
        super().__init__()
        env = env or _ENV or detect_env()
        check_num_gpus(num_gpus, env)
        if env.distributed and not dist.is_initialized():
            env, device = init_distributed(env)
        device = device or rank_device(env)
        model = model.to(device)
        if _active():
            # Buffers here are constants (rotary tables): no broadcast before every forward.
            ddp = nn.parallel.DistributedDataParallel
            new_name = "forward_sync_buffers" in inspect.signature(ddp).parameters  # torch 2.13 renamed it
            no_buffer_sync = {"forward_sync_buffers" if new_name else "broadcast_buffers": False}
            self.module: nn.Module = ddp(model, device_ids=[device.index] if device.type == "cuda" else None,
                                         **no_buffer_sync)
        else:
            self.module = model

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def no_sync(self) -> contextlib.AbstractContextManager:
        """Skip the gradient all-reduce (every micro-step of accumulation but the last)."""
        if isinstance(self.module, nn.parallel.DistributedDataParallel):
            return self.module.no_sync()
        return contextlib.nullcontext()

    @property
    def model(self) -> nn.Module:
        return unwrap(self.module)
