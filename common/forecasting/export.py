"""`marketgpt export RUN_DIR --format onnx|pt2|hf --out DIR`: the best model for inference
elsewhere (a laptop without CUDA, onnxruntime without torch) or for sharing.

onnx and pt2 export the next-token forward: tokens (batch, length) int64 with a dynamic batch
and any length from 1 to model.context_length, plus asset_ids and category_ids (batch,), to the
logits of the token after the last position (batch, vocab_size) float32. ONNX exports also
return every layer's keys and values (present_k, present_v: layers x batch x heads x length x
head size), and model_step.onnx takes them back as a prefix shared by each context's samples,
with each sample's own tokens since and one more token per row: a KV cache for sampling
(common.forecasting.infer; common.forecasting.export_graphs.Step has the inputs). pt2 is a torch.export ExportedProgram
(torch.export.load) of the plain forward; it replaced TorchScript, deprecated in torch (torch.jit.load warns in
2.13), whose --format now says so. hf is a model folder in a model hub's layout: the weights as
model.safetensors (no pickle), loaded by Forecaster.from_pretrained with torch. Beside the model:

    config.json, tokenizer.json, asset_info.json   the run's own, so the export forecasts alone
    reversion.json                                  where the run has one: its forecasts' volatility reversion
    model_card.json                                 format, inputs, training-data cutoff, universe,
                                                    parameter count, parent run and
                                                    checkpoint sha256, scorecard headline, parity check
    README.md                                       hf only: the model card for people (common.forecasting.model_card)

The files are written into a temp folder inside --out, the exported model is checked against
the torch model (onnx, pt2: logits on random inputs, which must agree to 1e-4; hf: the folder
loaded back, every tensor equal), and only then is each file renamed into --out, model_card.json
last: a failed export leaves no half-written file under a final name. Every file gets the mode
the umask gives a new one (as the user's other files).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch
from safetensors.torch import save_model

from common.atomic import default_mode
from common.errors import UserError
from common.forecasting.export_graphs import NextTokenLogits, Prefill, Step, random_inputs, step_input_names
from common.forecasting.forecaster import PRETRAINED_FILES, Forecaster
from common.forecasting.infer import STEP_FILE, OnnxBackend
from common.forecasting.model_card import model_card, model_card_markdown
from common.run.files import ASSET_INFO_JSON, BEST_MODEL_PT, CONFIG_JSON, REVERSION_JSON, TOKENIZER_JSON
from common.run.log import RunLog
from common.tokens.features import feature_columns

if TYPE_CHECKING:
    from common.model.gpt import MarketGPT

__all__ = [
    "FORMATS",
    "PARITY_ATOL",
    "export_onnx",
    "export_pt2",
    "export_run",
    "save_safetensors",
]

FORMATS = {"onnx": "model.onnx", "pt2": "model.pt2", "hf": PRETRAINED_FILES[0]}
PARITY_ATOL = 1e-4  # logits of the export and of the torch model agree this closely
ONNX_OPSET = 17
INPUTS = ("tokens", "asset_ids", "category_ids")


def export_run(run_dir: Path, fmt: str, out: Optional[Path] = None, interval: Optional[str] = None) -> Path:
    """Export the run's best model into `out` (default: <case>/exports/<run name>); returns it.
    interval: which of a run's data.intervals the export forecasts (None: its first; the onnx and
    pt2 forwards take its id as a constant; an hf folder keeps every interval's row)."""
    _check_format(run_dir, fmt)
    fc = Forecaster.from_run(run_dir, interval=interval)  # checks the run folder (and --interval)
    name = Path(run_dir).name + (f"_{fc.interval}" if fc.interval != fc.cfg.data.interval else "")
    out = Path(out) if out is not None else Path(run_dir).resolve().parent.parent / "exports" / name
    try:
        out.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".export_", dir=out))
    except OSError as e:
        raise UserError(f"--out {out} is not writable ({e.strerror or e}); pass --out a folder you can write") from None
    model = fc.model
    assert model is not None  # Forecaster.from_run: the run's torch model
    try:
        worst = _export_model(fc, model, Path(run_dir), fmt, staging)
        card = model_card(Path(run_dir), fc, _export_facts(fmt), worst)
        _publish(card, Path(run_dir), fmt, staging, out)
    except OSError as e:
        raise UserError(f"cannot write the export into {out} ({e.strerror or e})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _check_format(run_dir: Path, fmt: str) -> None:
    """A UserError for a format export_run does not write, or a run_dir that is an export itself."""
    if fmt == "torchscript":
        raise UserError(
            "--format torchscript: TorchScript is deprecated in torch (torch.jit); use --format pt2 "
            "(torch.export, torch.export.load) or --format onnx (onnxruntime, no torch needed)"
        )
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if not (Path(run_dir) / BEST_MODEL_PT).exists() and (Path(run_dir) / FORMATS["hf"]).is_file():
        raise UserError(f"{run_dir} is an exported model folder, not a run folder; export the run it came from")


def _export_model(fc: Forecaster, model: MarketGPT, run_dir: Path, fmt: str, staging: Path) -> float:
    """The run's files and the model in `fmt` into `staging`, checked against the torch model; returns the
    largest difference the check found."""
    wrapper = NextTokenLogits(model.eval()).eval()
    ids = model.asset_emb.num_embeddings, model.category_emb.num_embeddings  # asset_info.json's counts
    columns = export_feature_columns(model)
    example = random_inputs(2, fc.cfg.model.context_length, fc.cfg.model.vocab_size, *ids, feature_columns=columns)
    target = staging / FORMATS[fmt]
    for name in (CONFIG_JSON, TOKENIZER_JSON, ASSET_INFO_JSON):
        shutil.copy2(run_dir / name, staging / name)
    if (run_dir / REVERSION_JSON).is_file():  # the run's forecasts revert their spread: the export's too
        shutil.copy2(run_dir / REVERSION_JSON, staging / REVERSION_JSON)
    if fmt == "hf":
        save_safetensors(fc, run_dir, target)
        worst = check_pretrained(model, staging)
    else:
        with torch.no_grad(), warnings.catch_warnings():
            if fmt == "onnx":
                warnings.simplefilter("ignore")  # the ONNX tracer's notes on python ints in shapes (checked below)
                export_onnx(model, example, staging)
            else:
                export_pt2(wrapper, example, target)
        worst = check_parity(
            wrapper, target, fmt, fc.cfg.model.context_length, fc.cfg.model.vocab_size, *ids, feature_columns=columns
        )
    return worst


def export_feature_columns(model: "MarketGPT") -> int:
    """The candle-id columns an export's forward takes: 0 for a model that reads none."""
    c = model.config
    return feature_columns(c.vol_level_input, c.market_context, c.reads_peer) if c.reads_features else 0


def _export_facts(fmt: str) -> dict:
    """model_card.json's facts about the export: its format and files, KV cache, opset and torch."""
    return {
        "format": fmt,
        "file": FORMATS[fmt],
        "kv_cache": fmt == "onnx",
        "step_file": STEP_FILE if fmt == "onnx" else None,
        "opset": ONNX_OPSET if fmt == "onnx" else None,
        "torch_version": torch.__version__,
    }


def _publish(card: dict, run_dir: Path, fmt: str, staging: Path, out: Path) -> None:
    """Write the model card (and an hf folder's README.md) into `staging`, then move every file of the
    export into `out`, each with the user's default mode."""
    (staging / "model_card.json").write_text(json.dumps(card, indent=2) + "\n")
    model_files = {"onnx": (FORMATS[fmt], STEP_FILE), "hf": (FORMATS[fmt], "README.md")}.get(fmt, (FORMATS[fmt],))
    if fmt == "hf":
        (staging / "README.md").write_text(model_card_markdown(card, run_dir), encoding="utf-8")
    optional = (REVERSION_JSON,) if (staging / REVERSION_JSON).is_file() else ()
    for name in (*model_files, CONFIG_JSON, TOKENIZER_JSON, ASSET_INFO_JSON, "model_card.json", *optional):
        # safetensors writes 0600 and copy2 keeps the run's modes: each file reads as one the user writes
        os.chmod(staging / name, default_mode())
        os.replace(staging / name, out / name)


def _export_onnx(wrapper: torch.nn.Module, example: tuple, target: Path) -> None:
    batch = {0: "batch"}
    kv = {1: "batch", 3: "length"}
    # the TorchScript-based exporter: seconds, no onnxscript needed; batch and length stay dynamic
    torch.onnx.export(
        wrapper,
        example,
        str(target),
        input_names=[*INPUTS, *(["features"] if len(example) > 3 else [])],
        output_names=["logits", "present_k", "present_v"],
        dynamic_axes={
            "tokens": {0: "batch", 1: "length"},
            "features": {0: "batch", 1: "length"},
            "asset_ids": batch,
            "category_ids": batch,
            "logits": batch,
            "present_k": kv,
            "present_v": kv,
        },
        opset_version=ONNX_OPSET,
        dynamo=False,
    )


def _export_onnx_step(prefill: Prefill, step: Step, example: tuple, target: Path) -> None:
    """Traced with a shared prefix (2 contexts x 2 samples) and 2 own tokens each, so the graph holds
    the one-token decode branch with the group, prefix and own lengths all read from the shapes."""
    tokens, asset_ids, category_ids, *features = example
    _, prefix_k, prefix_v = prefill(tokens[:, :-3], asset_ids, category_ids, *(f[:, :-3] for f in features))
    rows = torch.arange(tokens.size(0)).repeat_interleave(2)
    layers, _, heads, _, size = prefix_k.shape
    own = torch.zeros(2 * layers, 2, len(rows), heads, size)  # values do not matter to the trace
    names = step_input_names(layers, bool(features))
    axes = {
        "token": {0: "batch"},
        "asset_ids": {0: "batch"},
        "category_ids": {0: "batch"},
        "features": {0: "batch"},
        "prefix_k": {1: "contexts", 3: "prefix"},
        "prefix_v": {1: "contexts", 3: "prefix"},
        **{name: {0: "own", 1: "batch"} for name in names if name.startswith("own_")},
        "logits": {0: "batch"},
        "new_k": {1: "batch"},
        "new_v": {1: "batch"},
    }
    torch.onnx.export(
        step,
        (
            tokens[rows, -3:-2],
            asset_ids[rows],
            category_ids[rows],
            *(f[rows, -3:-2] for f in features),
            prefix_k,
            prefix_v,
            *own,
        ),
        str(target),
        input_names=names,
        output_names=["logits", "new_k", "new_v"],
        dynamic_axes=axes,
        opset_version=ONNX_OPSET,
        dynamo=False,
    )


def export_onnx(model: "MarketGPT", example: tuple[torch.Tensor, ...], folder: Path) -> None:
    """model.onnx (a whole window's next-token logits) and STEP_FILE (one decoding step with the
    KV cache) into folder, traced on `example` (random_inputs). Call under torch.no_grad()."""
    # eval() on every wrapper: the exporter restores the mode of the module it was given
    _export_onnx(Prefill(model).eval(), example, folder / FORMATS["onnx"])
    _export_onnx_step(Prefill(model).eval(), Step(model).eval(), example, folder / STEP_FILE)


def export_pt2(wrapper: NextTokenLogits, example: tuple[torch.Tensor, ...], target: Path) -> None:
    """torch.export of the next-token forward, batch and length dynamic (1 to context_length),
    saved as an ExportedProgram (.pt2). Call under torch.no_grad()."""
    batch = torch.export.Dim("batch", min=1)
    length = torch.export.Dim("length", min=1, max=wrapper.model.config.context_length)
    shapes = {"tokens": {0: batch, 1: length}, "asset_ids": {0: batch}, "category_ids": {0: batch}}
    if len(example) > 3:
        shapes["features"] = {0: batch, 1: length}
    program = torch.export.export(wrapper, example, dynamic_shapes=shapes)
    torch.export.save(program, str(target))


def load_exported(path: Path, fmt: str, context_length: int) -> Any:
    """A callable (tokens, asset_ids, category_ids[, features]) -> numpy logits for an exported model file."""
    if fmt == "onnx":
        return OnnxBackend(path, context_length=context_length)
    module = torch.export.load(str(path)).module()
    return lambda *inputs: module(*(torch.as_tensor(x) for x in inputs)).detach().numpy()


def save_safetensors(fc: Forecaster, run_dir: Path, target: Path) -> None:
    """The model's weights as safetensors (tied weights once), with what from_pretrained needs
    beyond the tensors in the header's metadata (strings only): the parent checkpoint's sha256,
    the training precision (for --precision auto) and the fitted volume edges."""

    meta = {
        "format": "pt",
        "library": "marketgpt",
        "checkpoint_sha256": fc.checkpoint_sha256,
        "training_precision": RunLog.read(run_dir).precision,
        "volume_edges": None if fc.volume_edges is None else json.dumps(fc.volume_edges),
    }
    assert fc.model is not None  # a torch Forecaster
    save_model(fc.model, str(target), metadata={k: str(v) for k, v in meta.items() if v is not None})


def check_pretrained(model: torch.nn.Module, folder: Path) -> float:
    """The model folder loaded back (Forecaster.from_pretrained): every tensor must equal the
    model's; returns the largest difference (0.0)."""
    back = Forecaster.from_pretrained(folder, precision="fp32").model
    assert back is not None  # a torch Forecaster
    loaded = back.state_dict()
    mine = model.state_dict()
    worst = (
        max(float((mine[k].float() - loaded[k].float()).abs().max()) if mine[k].numel() else 0.0 for k in mine)
        if mine.keys() == loaded.keys()
        else float("inf")
    )
    if worst != 0.0:
        raise UserError(f"the hf folder's weights differ from the run's (by {worst:.3g}); not written")
    return worst


def check_parity(
    wrapper: torch.nn.Module,
    path: Path,
    fmt: str,
    context_length: int,
    vocab_size: int,
    num_assets: int,
    num_categories: int,
    feature_columns: int = 0,
) -> float:
    """Largest |logit difference| between the export and the torch model on random inputs of
    several batch sizes and lengths; a UserError if it exceeds PARITY_ATOL."""
    run = load_exported(path, fmt, context_length)
    wrapper.eval()
    worst = 0.0
    for i, (batch, length) in enumerate(((1, 1), (3, max(1, context_length // 2)), (5, context_length))):
        inputs = random_inputs(batch, length, vocab_size, num_assets, num_categories, 100 + i, feature_columns)
        t, a, c, *f = inputs
        with torch.no_grad():
            ref = wrapper(*inputs).numpy()
        got = run(*(x.numpy() for x in inputs))
        worst = max(worst, float(np.abs(ref - got).max()))
        if fmt == "onnx" and length > 1:  # the cached path: prefill all but the last token, then one step
            head = [x[:, :-1].numpy() for x in f]
            _, k, v = run.prefill(t[:, :-1].numpy(), a.numpy(), c.numpy(), *head)
            last = {"features": f[0][:, -1:].numpy()} if f else {}
            stepped = run.step(t[:, -1:].numpy(), a.numpy(), c.numpy(), k, v, **last)[0]
            worst = max(worst, float(np.abs(ref - stepped).max()))
    if not worst <= PARITY_ATOL:
        raise UserError(f"the {fmt} export's logits differ from torch's by {worst:.3g} (> {PARITY_ATOL}); not written")
    return worst
