"""bench/bench_gpu_ddp.py at toy size on the CPU: every variant's path runs and is reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_bench_gpu_ddp_smoke_reports_every_variant(tmp_path: Path) -> None:
    out = tmp_path / "ddp.json"
    # loopback only: the one-process gloo group binds lo, the store 127.0.0.1 (the script sets both)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    for launcher in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(launcher, None)
    cmd = [sys.executable, str(REPO / "bench" / "bench_gpu_ddp.py"), "--device", "cpu", "--smoke"]
    cmd += ["--batch", "4", "--threads", "1", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    figures = result["figures"]
    assert figures["device"] == "cpu" and figures["torch"] == __import__("torch").__version__
    assert "--smoke" in figures["command"]
    assert set(figures["cases"]) == {"C", "B"}
    for case in figures["cases"].values():
        variants = {v["variant"]: v for v in case["variants"]}
        assert list(variants) == ["a", "b", "c", "d", "e"]
        for v in variants.values():
            rate, reason = v["tokens_per_sec"], v["reason"]
            assert (rate is not None and rate > 0) or (isinstance(reason, str) and reason), v
    assert "case C, d" in proc.stdout  # the table


def test_a_failing_variant_records_a_one_line_reason(monkeypatch) -> None:
    """What compiled DDP or the whole-step graph may do on a GPU: raise. The variant says why."""
    import torch

    sys.path.insert(0, str(REPO / "bench"))
    import bench_gpu_ddp

    def broken(*args, **kwargs):
        raise RuntimeError("graph capture failed\nmore detail")

    monkeypatch.setattr(bench_gpu_ddp, "run_case", broken)
    v = bench_gpu_ddp.run_variant("b", None, torch.device("cpu"), 4, 2, 1, None)
    assert v["tokens_per_sec"] is None and v["reason"] == "RuntimeError: graph capture failed"
