"""The torch-free laptop install of docs/remote.md, run as its lines are typed, in a fresh venv made
from the base interpreter (none of this test environment's packages): the package without its
dependencies, then the `[infer]` list. `marketgpt` must then start and forecast from an ONNX export.

Offline: pip reads only the wheels that `./quickstart.sh test` downloads into .cache/wheelhouse.
"""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WHEELHOUSE = REPO / ".cache" / "wheelhouse"
ONNX_EXPORT = REPO / "tests" / "fixtures" / "exports" / "onnx"


def torch_free_lines() -> list[str]:
    """The install lines of docs/remote.md's "Without torch", comments dropped."""
    section = (REPO / "docs" / "remote.md").read_text().split("### Without torch", 1)[1].split("\n### ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_the_documented_lines_install_the_package_alone_then_the_infer_extra():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    infer = [req.split(">")[0].split("=")[0] for req in cfg["options.extras_require"]["infer"].split()]
    assert torch_free_lines() == ["pip install --no-deps -e .", "pip install " + " ".join(infer)]


def test_a_laptop_without_torch_installs_as_documented_and_forecasts_from_an_onnx_export(tmp_path):
    if not (WHEELHOUSE / "COMPLETE").is_file():
        message = f"no wheels in {WHEELHOUSE}: ./quickstart.sh test downloads them"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    laptop = tmp_path / "laptop"
    base = getattr(sys, "_base_executable", sys.executable)  # the interpreter under this test's venv
    subprocess.run([base, "-m", "venv", str(laptop)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))}
    env |= {
        "PATH": f"{laptop / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(laptop),
        "PIP_NO_INDEX": "1",  # nothing from the network: only the wheelhouse
        "PIP_FIND_LINKS": str(WHEELHOUSE),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_COMPILE": "1",  # no .pyc files written at install: seconds saved, nothing else changes
    }
    for line in torch_free_lines():
        proc = subprocess.run(["bash", "-c", line], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{line}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"

    python = laptop / "bin" / "python"
    probe = "import importlib.util as u; print([m for m in ('torch', 'tqdm') if u.find_spec(m)])"
    assert subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True).stdout.strip() == "[]"

    out = tmp_path / "fc"
    args = ["forecast", str(ONNX_EXPORT), "--backend", "onnx", "--symbols", "AAPL,IBM", "--horizon", "5"]
    args += ["--samples", "30", "--out", str(out)]
    for argv in (["--help"], ["status"], args):  # from the console script, outside the repo
        proc = subprocess.run(
            [laptop / "bin" / "marketgpt", *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"marketgpt {' '.join(argv)}: {proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    assert "AAPL" in proc.stdout and "IBM" in proc.stdout
    meta = json.loads((out / "forecast.json").read_text())
    assert meta["backend"] == "onnx" and (out / "forecast.parquet").is_file()
