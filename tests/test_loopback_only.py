"""Tests, benchmarks, tools, CI and scripts talk only to this machine: no IPv4 address outside the
loopback range (127.0.0.0/8) or 0.0.0.0 (listen on every interface) is written in them, not even
one meant never to answer (a silent server on 127.0.0.1 stands in for that, see test_remote.py).
The scanner is a pure function of a file's text: its own test needs a string and a temporary tree."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# the folders with code that runs (docs/ and the READMEs may show example addresses)
SCANNED = ["tests", "bench", "tools", "common", ".ci", *sorted(p.name for p in REPO.glob("case_*"))]
SUFFIXES = {".py", ".sh", ".json", ".cfg", ".toml", ".yaml", ".yml", ".conf", ".txt", ""}  # "": .ci/run
SKIP_DIRS = {"__pycache__", "checkpoints", "logs", "results"}  # run outputs, bench measurements
# (path, literal): why it is not an address this code connects to
ALLOWED = {("common/data/yahoo_requests.py", "131.0.0.0"): "Chrome's version in a browser User-Agent header"}
THIS = Path(__file__).resolve()  # its literals are ALLOWED's and the scanner's test examples
IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.])")


def off_machine_addresses(text: str) -> list[tuple[int, str]]:
    """(line number, literal) of every IPv4 address in `text` outside 127.0.0.0/8 and 0.0.0.0."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for literal in IPV4.findall(line):
            try:
                address = ipaddress.IPv4Address(literal)
            except ValueError:  # 300.1.2.3: four numbers, not an address
                continue
            if not (address.is_loopback or address.is_unspecified):
                found.append((number, literal))
    return found


def scanned_files(root: Path = REPO) -> list[Path]:
    """The code, configs and scripts under SCANNED, and the top-level ones (launchers, setup.cfg)."""
    files = [p for p in root.iterdir() if p.is_file() and p.suffix in SUFFIXES - {""}]
    for top in SCANNED:
        for dirpath, dirnames, filenames in os.walk(root / top):
            rel = Path(dirpath).relative_to(root)
            # a case's data/ holds downloaded candles; common/data is code
            dirnames[:] = [
                d for d in dirnames if d not in SKIP_DIRS and not (rel.name.startswith("case_") and d == "data")
            ]
            files += [Path(dirpath, name) for name in filenames if Path(name).suffix in SUFFIXES]
    return sorted(files)


def findings(root: Path = REPO) -> list[str]:
    """`path:line: address` for each address off this machine, less the ALLOWED ones."""
    out = []
    for path in scanned_files(root):
        if path.resolve() == THIS:
            continue
        rel = path.relative_to(root).as_posix()
        text = path.read_text(errors="replace")
        out += [f"{rel}:{n}: {literal}" for n, literal in off_machine_addresses(text) if (rel, literal) not in ALLOWED]
    return out


def test_no_address_off_this_machine_is_written_in_code():
    assert findings() == [], "use 127.0.0.1 (or a documentation example in ALLOWED, with why)"


def test_the_scan_covers_tests_bench_tools_ci_scripts_and_cases():
    names = {p.relative_to(REPO).as_posix() for p in scanned_files()}
    assert {
        "tests/test_remote.py",
        "bench/bench_slurm.py",
        "tools/local_slurm/local_slurm.sh",
        ".ci/run",
        "common/cluster/remote.py",
        "launch_parallel_training.sh",
        "quickstart.sh",
        "setup.cfg",
        "case_c_crypto/slurm_scripts/train_crypto_a100.sh",
        "case_c_crypto/configs/crypto_prototype.json",
    } <= names


# a private-range example, put together here so that no grep of the repository finds one in code
OFF = ".".join(("10", "1", "2", "3"))


def test_the_scanner_finds_an_address_off_this_machine_and_nothing_else(tmp_path):
    assert off_machine_addresses(f'ssh("root@{OFF}")\nconnect(("127.0.0.1", 22))') == [(1, OFF)]
    assert off_machine_addresses("127.0.0.1 127.1.2.3 0.0.0.0 v1.2.3.4 1.2.3.4.5 300.1.2.3 torch==2.1.0") == []
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(f'HOST = "{OFF}"\n')
    (tmp_path / "run.sh").write_text("ssh -p 2222 root@127.0.0.1 true\n")
    assert findings(tmp_path) == [f"tests/test_x.py:1: {OFF}"]
    (tmp_path / "tests" / "test_x.py").write_text('HOST = "127.0.0.1"\n')
    assert findings(tmp_path) == []
