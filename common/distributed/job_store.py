"""The job's key-value store (served by rank 0, or by torchrun's agent): rank 0's decisions
for the other ranks (`share_from_main`, `wait_for_main`), each rank's heartbeat and how it
ended, and the failure reports built from them.

Failures are loud and bounded. A rank that raises posts its error to the store before it exits,
and every rank bumps a heartbeat counter there each second. When a collective fails on a rank
(a peer's sockets closed, or the timeout hit), `failures_reported()` reads the posts for a few
seconds and raises `RankFailed` naming the rank that raised, or the one whose heartbeat stopped
without a word (killed, out of memory, node lost). A rank that loses rank 0 (and with it the
store) can only say so.

NCCL doesn't raise in Python when a peer leaves: the survivor's next device sync just waits
(until the timeout, when NCCL's watchdog aborts the process). So the heartbeat thread also
watches the posts: a rank still running 15 s after a peer posted its error prints that error
and exits (code 2). A peer killed without a word (OOM killer, kill -9) still costs an NCCL job
the full timeout: lower MARKETGPT_DIST_TIMEOUT to bound it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import torch.distributed as dist

from common.distributed.env import DistEnv, collective_timeout_s, several_ranks
from common.errors import UserError

__all__ = [
    "RankFailed",
    "before_abort",
    "close",
    "failures_reported",
    "joined_env",
    "share_from_main",
    "start",
    "wait_for_main",
]

_REPORT_WAIT_S = 5.0  # how long a rank that lost a peer waits for the others' error reports
_LINGER_S = 2.0  # rank 0 keeps serving the store this much longer, for ranks that noticed later
_HEARTBEAT_S = 1.0  # each rank's sign of life in the store (see _start_heartbeat)
_RAISED = "raised "  # prefix of a rank's posted status when it failed with an exception
_WATCHDOG_S = 15.0  # a peer raised this long ago and this rank still runs: it is stuck (NCCL)


class RankFailed(UserError):
    """Another rank of the job failed; this one stops too (the message names the failed rank)."""


_STORE: Optional[dist.Store] = None  # the job's key-value store: error reports, rank 0's decisions
_ENV: Optional[DistEnv] = None
_HEARTBEAT: Optional[tuple[threading.Event, threading.Thread]] = None
_BEFORE_ABORT: list[Callable[[], Any]] = []  # what the watchdog finishes before os._exit


def start(store: dist.Store, env: DistEnv, timeout: datetime.timedelta) -> None:
    """This rank joined the job through `store`: report through it from now on, and beat."""
    global _STORE, _ENV
    _STORE, _ENV = store, env
    _start_heartbeat(env, timeout)


def joined_env() -> Optional[DistEnv]:
    """The job this process joined (None before `start` and after `close`)."""
    return _ENV


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
    print(
        f"error: rank {env.rank} stops because {culprits} (this rank was still waiting for it "
        f"{_WATCHDOG_S:g} s later); see that rank's log for the cause, then resume with --resume auto",
        file=sys.stderr,
        flush=True,
    )
    os._exit(2)  # the main thread is stuck in C++: nothing can raise into it


def _stop_heartbeat() -> None:
    if _HEARTBEAT is not None:
        stop, thread = _HEARTBEAT
        stop.set()
        thread.join(timeout=2 * _HEARTBEAT_S)


def close() -> None:
    """Stop the heartbeat and post "finished", unless this rank already posted how it ended: a
    rank 0 that raised then need not keep the store up for this one (_serve_until_read)."""
    global _STORE, _ENV, _HEARTBEAT
    _stop_heartbeat()
    if _STORE is not None and _ENV is not None:
        try:
            if _store_alive() and not _STORE.check([_key(f"status/{_ENV.rank}")]):
                _post("finished")
        except Exception:
            pass
    _STORE = _ENV = _HEARTBEAT = None


def _key(name: str, env: Optional[DistEnv] = None) -> str:
    env = env or _ENV
    return f"marketgpt/{env.attempt if env else 0}/{name}"


def share_from_main(name: str, value: Any = None) -> Any:
    """Rank 0's JSON-able `value` on every rank (rank 0 decides: the run folder, a resume).

    Goes through the store rather than a collective, so the other ranks may wait the whole
    timeout while rank 0 prepares data; if rank 0 dies meanwhile, the wait fails at once.
    """
    if not several_ranks():
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
    if not several_ranks() or _STORE is None or _ENV is None:
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
        raise RankFailed(
            f"rank {_ENV.rank}: rank 0 ended while this rank waited for its {name} "
            f"({str(e).splitlines()[0][:200]}); see rank 0's log"
        ) from None


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
    env, store = env or _ENV, store or _STORE
    if env is None or store is None:  # not joined: nobody to tell
        return False
    try:
        store.set(_key(f"status/{env.rank}", env), status)
        return True
    except Exception:  # the store died with its host: nothing to tell anyone
        return False


def _statuses(store: dist.Store, env: DistEnv, ranks: Sequence[int]) -> dict[int, str]:
    """rank -> how it ended, for those of `ranks` that posted it."""
    keys = {r: _key(f"status/{r}", env) for r in ranks}
    return {r: store.get(key).decode() for r, key in keys.items() if store.check([key])}


def _errors(statuses: Mapping[int, str]) -> dict[int, str]:
    """rank -> its error message, for the ranks that raised."""
    return {r: s[len(_RAISED) :] for r, s in statuses.items() if s.startswith(_RAISED)}


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
        return (
            "rank 0 is gone, and with it the job's store (rank 0 failed, or stopped after another rank "
            "failed: its own message names the cause)"
        )
    posted, stalled = reports
    raised = _errors(posted)
    parts = [f"rank {r} failed with {msg}" for r, msg in sorted(raised.items())]
    if stalled:
        parts.append(
            f"{ranks(sorted(stalled))} stopped without reporting an error (killed, out of memory, or its node was lost)"
        )
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
        raise RankFailed(
            f"rank {_ENV.rank} stops because {_culprits(reports, e)}; see that rank's log for "
            "the cause, then resume with --resume auto"
        ) from e


def _serve_until_read() -> None:
    """Rank 0 raised and serves the store: keep it up until every other rank has posted how it
    ended (they read this rank's error first), or their watchdogs have had time to read it."""
    assert _ENV is not None and _STORE is not None  # joined
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
