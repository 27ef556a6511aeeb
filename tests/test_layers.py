"""The library's floors (docs/architecture.md), held by a static read of every module in common/.

    root (errors, atomic, paths, markets, special_tokens; the config package)
      -> data (and run.files), tokens -> model -> distributed -> run -> training -> forecasting
      -> evaluation -> commands -> cluster (and slurm/: submit, prepare_jobs, sweep_jobs) -> cli

- A module imports only its own floor or floors below it, inside functions too: a lazy upward
  import still ties the lower floor to the upper one.
- data, tokens and cluster load without torch: nothing they import at module level, however
  indirectly, imports torch (checked statically, then by a real import in a fresh process).
- Only common/cli/ parses arguments: library code takes typed arguments, never an argparse.Namespace.
- An import inside a function is allowed only where it is listed below with its reason: an
  optional dependency, or keeping a heavy library (torch, pandas, matplotlib, ...) off a light path.
- No module imports another module's private name (`from common.x import _name`): a name used
  across modules is public.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from common.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "common"

FLOORS = {
    "root": 0,
    "data": 1,
    "tokens": 1,
    "model": 2,
    "distributed": 3,
    "run": 4,
    "training": 5,
    "forecasting": 6,
    "evaluation": 7,
    "commands": 8,
    "cluster": 9,
    "cli": 10,
}
# The seed guide's import paths: thin re-exports of a name from a higher floor, kept for users' scripts.
SEED_SHIMS = {
    "common.tokenizer": "tokens",
    "common.market_gpt_multi": "model",
    "common.distributed_utils": "distributed",
}
NO_TORCH = ("data", "tokens", "cluster")
# common/run/: the names of a run folder's files stand on the data floor, where a token shard
# (which holds the first four under the same names) reads them; the package file imports
# nothing. The run folder, its checkpoints and resume stand on the run floor.
RUN_DATA_FLOOR = ("common.run", "common.run.files")
# strings equal to a run file's name that are not about a run folder: (module, name) -> why
NOT_RUN_FILES = {
    ("common.evaluation.foundation_baselines", "config.json"): "a Hugging Face model's own config file",
}

# Libraries imported inside the function that needs them wherever they are used, never at a
# module's top (test_lazy_libraries_are_never_imported_at_the_top): library -> why.
LAZY_EVERYWHERE = {
    "matplotlib": "only when a picture is drawn (Agg chosen first)",
    "arch": "seconds to import; only when GARCH or HAR is fitted or a scorecard is scored",
    "yfinance": "reads YF_DISABLE_CURL_CFFI once, when imported; only Yahoo assets need it",
    "onnxruntime": "the `infer`/`export` extra",
    "wandb": "the optional `wandb` extra, only with training.tracker = wandb",
    "mlflow": "the optional `mlflow` extra, only with training.tracker = mlflow",
    "chronos": "the `foundation` extra, only with --baseline chronos",
    "timesfm": "the `foundation` extra, only with --baseline timesfm",
    "huggingface_hub": "installed with the `foundation` extra",
}
# Floors whose modules import what they use inside functions: the CLI imports each subcommand's
# module when it runs (`marketgpt --help` is instant; one broken extra breaks one command).
LAZY_FLOORS = ("cli",)

# (importing module, imported module) -> why the import waits for the function that needs it.
_TORCH_LATER = "torch loads only when this path runs: the module itself is imported where torch is not"
LAZY = {
    # optional dependencies (setup.cfg extras) and libraries a command may never need
    ("common.data.download", "common.data.download_ccxt"): "imports ccxt, about 2 s; only crypto assets need it",
    ("common.data.download", "common.data.exchange_universe"): 'imports ccxt; only data.universe = "exchange"',
    ("common.evaluation.significance", "scipy"): "seconds to import; only when a scorecard is scored",
    ("common.evaluation.metrics", "scipy"): "seconds to import; training imports this module",
    ("common.evaluation.metrics", "scoringrules"): "seconds to import; training imports this module",
    ("common.slurm.sweep_jobs", "common.commands.sweep"): _TORCH_LATER,
    ("common.training.trackers", "torch"): "torch.utils.tensorboard: seconds to import, only when TensorBoard is on",
    ("common.run.checkpoint", "torch"): "torch.utils.serialization exists only in newer torch",
    # keeping torch off light paths: `marketgpt status`, `remote`, `submit`, and ONNX forecasting
    ("common.cluster.fetch_check", "common.run.checkpoint"): _TORCH_LATER,
    ("common.slurm.submit", "common.commands.train"): _TORCH_LATER,
    ("common.slurm.submit", "common.distributed.env"): _TORCH_LATER,
    ("common.slurm.submit", "common.run.resume"): _TORCH_LATER,
    ("common.commands.forecast", "torch"): "the onnx backend forecasts without torch",
    ("common.commands.forecast", "common.forecasting.ensemble"): "imports torch; the onnx backend runs without it",
    # keeping scipy, scoringrules and the forecasting stack out of the training start-up (and of
    # every resume): the end-of-training scorecard imports them when training ends
    (
        "common.evaluation.final_scorecard",
        "common.evaluation.scorecard",
    ): "scipy and scoringrules: out of the training start-up",
    ("common.evaluation.final_scorecard", "common.forecasting.forecaster"): "out of the training start-up",
    ("common.evaluation.final_scorecard", "common.evaluation.vol_reversion"): "the scorecard's: out of the start-up",
    # the optional `foundation` extra (--baseline): seconds to import transformers, only when asked for
    ("common.evaluation.foundation_baselines", "torch"): "chronos takes tensors; only with --baseline chronos",
    # keeping pandas off the config's path: the config loads without numpy, pandas or torch
    ("common.markets", "pandas"): "interval_step is the one pandas user; the config imports this leaf",
}


def floor_of(module: str) -> str:
    """The floor a module of common/ stands on."""
    if module in SEED_SHIMS:
        return SEED_SHIMS[module]
    parts = module.split(".")
    if parts[:2] == ["common", "cli"]:
        return "cli"
    if parts[:2] == ["common", "slurm"]:
        return "cluster"
    if parts[:2] == ["common", "config"]:
        return "root"  # the config package stands with the root modules: everything reads it
    if parts[:2] == ["common", "run"]:
        return "data" if module in RUN_DATA_FLOOR else "run"
    if len(parts) > 2 or (len(parts) == 2 and parts[1] in FLOORS):
        return parts[1]
    return "root"


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def imports(tree: ast.AST) -> list[tuple[str, bool]]:
    """(imported module, inside a function?) for every import outside `if TYPE_CHECKING:`.

    `from a.b import c` yields both a.b and a.b.c: c may be a module of the package.
    """
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if _is_type_checking(node):
            for child in node.orelse:
                visit(child, in_function)
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, in_function))
            found.extend((f"{node.module}.{a.name}", in_function) for a in node.names)
        elif isinstance(node, ast.Import):
            found.extend((a.name, in_function) for a in node.names)
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return found


def library_modules(root: Path = REPO_ROOT) -> dict[str, ast.AST]:
    out = {}
    for path in sorted((root / "common").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text(encoding="utf-8"))
    return out


def _own(imported: str, modules: dict[str, ast.AST]) -> str | None:
    """The package module an import names (`common.x.y` of `from common.x.y import f`), else None."""
    while imported:
        if imported in modules:
            return imported
        imported = imported.rpartition(".")[0]
    return None


def upward_imports(modules: dict[str, ast.AST]) -> list[str]:
    """Every import of a module on a higher floor than the importer's, as 'a (floor) -> b (floor)'."""
    bad = []
    for name, tree in modules.items():
        here = FLOORS[floor_of(name)]
        for imported, _ in imports(tree):
            target = _own(imported, modules)
            if target is not None and FLOORS[floor_of(target)] > here:
                bad.append(f"{name} ({floor_of(name)}) -> {target} ({floor_of(target)})")
    return sorted(set(bad))


def unlisted_lazy_imports(
    modules: dict[str, ast.AST],
    allowed: dict[tuple[str, str], str] = LAZY,
    everywhere: Sequence[str] = tuple(LAZY_EVERYWHERE),
    floors: Sequence[str] = LAZY_FLOORS,
) -> list[str]:
    """Imports inside functions that neither LAZY, LAZY_EVERYWHERE nor LAZY_FLOORS allow (by the
    top-level name of what they import)."""
    bad = []
    for name, tree in modules.items():
        if floor_of(name) in floors:
            continue
        for imported, in_function in imports(tree):
            target = _own(imported, modules) or imported.split(".")[0]
            if in_function and target not in everywhere and (name, target) not in allowed:
                bad.append(f"{name} imports {target} inside a function")
    return sorted(set(bad))


def top_level_lazy_libraries(
    modules: dict[str, ast.AST], everywhere: Sequence[str] = tuple(LAZY_EVERYWHERE)
) -> list[str]:
    """'module imports library' for every module-level import of a LAZY_EVERYWHERE library."""
    return sorted(
        {
            f"{name} imports {imported.split('.')[0]}"
            for name, tree in modules.items()
            for imported, in_function in imports(tree)
            if not in_function and imported.split(".")[0] in everywhere
        }
    )


def torch_paths(modules: dict[str, ast.AST], packages: tuple[str, ...] = NO_TORCH) -> list[str]:
    """For each module of `packages` that reaches torch through module-level imports: the chain."""
    top = {
        name: {_own(i, modules) or i for i, in_function in imports(tree) if not in_function}
        for name, tree in modules.items()
    }
    bad = []
    for start in sorted(n for n in modules if floor_of(n) in packages and n not in SEED_SHIMS):
        seen, stack = {start}, [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(top.get(node, ())):
                if nxt == "torch" or nxt.startswith("torch."):
                    bad.append(" -> ".join(path + ["torch"]))
                    stack.clear()
                    break
                if nxt in modules and nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    return bad


def private_imports(modules: dict[str, ast.AST]) -> list[str]:
    """Every `from common.x import _name` (or a relative one), as 'importer imports module._name'."""
    bad = []
    for name, tree in modules.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not (node.level or _own(node.module or "", modules)):
                continue
            bad.extend(
                f"{name} imports {'.' * node.level}{node.module or ''}.{a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            )
    return sorted(set(bad))


def argparse_users(modules: dict[str, ast.AST]) -> list[str]:
    return sorted(
        name
        for name, tree in modules.items()
        if floor_of(name) != "cli" and any(i == "argparse" or i.startswith("argparse.") for i, _ in imports(tree))
    )


# --------------------------------------------------------------------------- the rules on common/


def test_no_module_imports_a_higher_floor():
    modules = library_modules()
    assert {floor_of(n) for n in modules} == set(FLOORS), "every floor has modules (the scan sees the package)"
    assert upward_imports(modules) == []


def test_imports_inside_functions_are_listed_with_a_reason():
    assert unlisted_lazy_imports(library_modules()) == []


def test_every_listed_lazy_import_still_exists():
    modules = library_modules()
    present = {
        (name, _own(i, modules) or i.split(".")[0])
        for name, tree in modules.items()
        for i, in_function in imports(tree)
        if in_function
    }
    stale = [pair for pair in LAZY if pair not in present]
    assert stale == [], "LAZY lists imports that are gone: remove them"
    used = {target for _, target in present}
    assert [lib for lib in LAZY_EVERYWHERE if lib not in used] == [], "LAZY_EVERYWHERE lists a library no longer used"


def test_lazy_libraries_are_never_imported_at_the_top():
    assert top_level_lazy_libraries(library_modules()) == []


def test_training_starts_without_the_scoring_libraries():
    """What the lazy imports of the end-of-training scorecard and of evaluation.metrics buy: a
    training process (and every resume) loads no scipy, scoringrules or forecasting stack."""
    heavy = ("scipy", "scoringrules", "arch", "matplotlib", "common.forecasting.forecaster")
    code = f"import sys, common.commands.train\nprint([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.strip() == "[]"


def test_data_tokens_and_cluster_load_without_torch():
    modules = library_modules()
    assert torch_paths(modules) == []
    names = sorted(n for n in modules if floor_of(n) in NO_TORCH and n not in SEED_SHIMS)
    code = f"import importlib, sys\nfor n in {names!r}: importlib.import_module(n)\nprint('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.strip() == "False"


def run_file_spellings(modules: dict[str, ast.AST]) -> list[str]:
    """'module: name' for every string constant outside common/run/ that spells a run file's name
    (common/run/files.py holds them all), docstrings included, save NOT_RUN_FILES."""
    from common.run import files

    names = {getattr(files, k) for k in files.__all__} - {files.TOKENS_DIR, files.FORECASTS_DIR}
    bad = []
    for module, tree in modules.items():
        if module.startswith("common.run"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names and (module, node.value) not in NOT_RUN_FILES:
                bad.append(f"{module}: {node.value}")
    return sorted(set(bad))


def test_only_common_run_spells_a_run_files_name():
    assert run_file_spellings(library_modules()) == []


def test_only_the_cli_parses_arguments():
    assert argparse_users(library_modules()) == []


def test_no_module_imports_another_modules_private_name():
    assert private_imports(library_modules()) == []


# --------------------------------------------------------------------------- the checks can fail


def _fake(sources: dict[str, str]) -> dict[str, ast.AST]:
    return {name: ast.parse(src) for name, src in sources.items()}


def test_an_upward_import_is_found_even_inside_a_function():
    modules = _fake(
        {
            "common.errors": "",
            "common.data.cache": "from common.errors import UserError",
            "common.training.trainer": "from common.data.cache import CandleCache",
            "common.model.gpt": "def f():\n    from common.training.trainer import Trainer",
            "common.tokenizer": "from common.tokens.tokenizer import OHLCTokenizer",
            "common.tokens.tokenizer": "",
            "common.cli": "def main():\n    from common.cluster.remote import x",
            "common.cluster.remote": "",
        }
    )
    assert upward_imports(modules) == ["common.model.gpt (model) -> common.training.trainer (training)"]


def test_an_unlisted_lazy_import_is_found():
    modules = _fake(
        {
            "common.data.yahoo": "import numpy\ndef f():\n    import yfinance\n    import numpy",
            "common.cli": "def g():\n    import torch",
        }
    )
    assert unlisted_lazy_imports(modules, {}, (), ("cli",)) == [
        "common.data.yahoo imports numpy inside a function",
        "common.data.yahoo imports yfinance inside a function",
    ]
    assert unlisted_lazy_imports(modules, {("common.data.yahoo", "numpy"): ""}, ("yfinance",), ("cli",)) == []
    assert unlisted_lazy_imports(modules, {("common.data.yahoo", "numpy"): ""}, ("yfinance",), ()) == [
        "common.cli imports torch inside a function"
    ]
    top = _fake(
        {"common.evaluation.report": "import matplotlib.pyplot as plt", "common.x": "def f():\n    import arch"}
    )
    assert top_level_lazy_libraries(top, ("matplotlib", "arch")) == ["common.evaluation.report imports matplotlib"]


def test_torch_reached_through_a_chain_is_found():
    modules = _fake(
        {
            "common.data.a": "from common.model.b import x",
            "common.model.b": "import torch.nn",
            "common.tokens.c": "def f():\n    import torch",
            "common.cluster.d": "import numpy",
        }
    )
    assert torch_paths(modules) == ["common.data.a -> common.model.b -> torch"]


def test_a_run_file_spelled_outside_common_run_is_found():
    modules = _fake(
        {
            "common.run.folder": 'NAME = "training_log.json"',
            "common.cluster.status": 'log = run / "training_log.json"',
            "common.evaluation.foundation_baselines": 'ok = "config.json"',
        }
    )
    assert run_file_spellings(modules) == ["common.cluster.status: training_log.json"]


def test_argparse_outside_the_cli_is_found():
    modules = _fake({"common.cli": "import argparse", "common.commands.x": "from argparse import Namespace"})
    assert argparse_users(modules) == ["common.commands.x"]


def test_a_private_import_across_modules_is_found():
    modules = _fake(
        {
            "common.config": "def _build(): pass\ndef load_config(): pass",
            "common.cluster.remote": "from common.config import _build, load_config as _load\n"
            "from yfinance import _http\nfrom common.config import __all__",
            "common.data.yahoo": "def f():\n    from .cache import _key",
        }
    )
    assert private_imports(modules) == [
        "common.cluster.remote imports common.config._build",
        "common.data.yahoo imports .cache._key",
    ]


# What a login node or a laptop without torch must be able to start: the CLI itself, `status`
# (text and JSON) and `remote`. tqdm is the training floor's progress bar, not a dependency of these.
LOGIN_BLOCKED = ("torch", "tqdm", "common.training", "common.model")
LOGIN_CHECK = """
import contextlib, io, sys
blocked = {blocked!r}
class Blocker:
    def find_spec(self, name, path, target=None):
        if any(name == b or name.startswith(b + ".") for b in blocked):
            raise ImportError(name + " is blocked in this test")
sys.meta_path.insert(0, Blocker())
from common.cli import main
for argv in (["--help"], ["status"], ["status", "--json"], ["remote", "--help"]):
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exit:
            code = exit.code
    assert code in (0, None), (argv, code)
print(sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in blocked)))
"""


def test_the_login_node_commands_load_no_training_module_torch_or_tqdm():
    code = LOGIN_CHECK.format(blocked=LOGIN_BLOCKED)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
