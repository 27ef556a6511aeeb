"""Fine-tuning (`marketgpt train --init-from`): the parent's tokenizer, weights and embeddings
matched by name, training.freeze, lineage, data.categories, refusals, --resume auto, and DDP."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from common.cli import main
from common.commands.train import run_training
from common.config import ModelConfig, load_config
from common.model.gpt import MarketGPT
from common.training.finetune import apply_freeze

from tests.ddp_helpers import start_ranks, train_command

FILES = Path(__file__).parent / "fixtures" / "files" / "good_folder"

TINY = {
    "experiment": "parent",
    "model": {
        "vocab_size": 64,
        "context_length": 8,
        "d_model": 32,
        "num_layers": 2,
        "num_heads": 2,
        "d_ff": 64,
        "asset_embed_dim": 4,
        "category_embed_dim": 4,
        "dropout": 0.0,
    },
    "training": {
        "batch_size": 8,
        "epochs": 1,
        "max_steps_per_epoch": 3,
        "eval_max_batches": 1,
        "warmup_steps": 1,
        "device": "cpu",
        "scorecard_origins": 0,
        "vol_reversion": False,
    },
    "data": {"source": "files", "files_dir": "candles", "universe": "universe.csv", "interval": "1d"},
}
PARENT_UNIVERSE = "symbol,source,category,name\nAAA,yfinance,us_stock,A\nBBB,yfinance,us_stock,B\n"
# CCC: a new asset of a category the parent knows; EEE: an asset of a category it never saw
CHILD_UNIVERSE = PARENT_UNIVERSE + "CCC,yfinance,us_stock,C\nEEE,yfinance,fx,E\n"


def make_case(root: Path, experiment: str, universe: str, **training) -> Path:
    case = root / experiment
    (case / "configs").mkdir(parents=True)
    shutil.copytree(FILES, case / "candles")
    shutil.copy(FILES / "AAA.csv", case / "candles" / "EEE.csv")
    (case / "universe.csv").write_text(universe)
    raw = json.loads(json.dumps(TINY))
    raw["experiment"] = experiment
    raw["training"].update(training)
    config = case / "configs" / f"{experiment}.json"
    config.write_text(json.dumps(raw))
    return config


def only_run(config: Path) -> Path:
    (run,) = (config.parent.parent / "checkpoints").glob(f"{config.stem}_*")
    return run


@pytest.fixture(scope="module")
def parent(tmp_path_factory) -> Path:
    config = make_case(tmp_path_factory.mktemp("ft"), "parent", PARENT_UNIVERSE)
    assert main(["train", "--config", str(config)]) == 0
    return only_run(config)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["model"]


def test_child_keeps_tokenizer_matches_embeddings_by_name_and_records_lineage(parent, tmp_path):
    config = make_case(tmp_path, "child", CHILD_UNIVERSE, freeze="embeddings", learning_rate=1e-2)
    assert main(["train", "--config", str(config), "--init-from", str(parent)]) == 0
    child = only_run(config)
    assert (child / "tokenizer.json").read_text() == (parent / "tokenizer.json").read_text()

    lineage = json.loads((child / "config.json").read_text())["_lineage"]
    assert lineage == json.loads((child / "training_log.json").read_text())["lineage"]
    assert lineage["parent_run"] == str(parent.resolve())
    assert lineage["checkpoint"] == str((parent / "best_model.pt").resolve())
    assert lineage["checkpoint_sha256"] == hashlib.sha256((parent / "best_model.pt").read_bytes()).hexdigest()
    assert (lineage["assets"], lineage["assets_from_category_mean"], lineage["assets_fresh"]) == (
        ["AAA", "BBB"],
        ["CCC"],
        ["EEE"],
    )
    assert (lineage["categories"], lineage["categories_fresh"]) == (["us_stock"], ["fx"])
    assert lineage["freeze"] == "embeddings" and "asset_emb.weight" in lineage["frozen_parameters"]
    assert load_config(child / "config.json").training.init_from == str(parent.resolve())

    # embeddings were frozen, so the child's trained weights still hold what the init copied
    p, c = weights(parent / "best_model.pt"), weights(child / "checkpoint_epoch_1.pt")
    ids = {a["symbol"]: a["id"] for a in json.loads((child / "asset_info.json").read_text())["assets"]}
    old = {a["symbol"]: a["id"] for a in json.loads((parent / "asset_info.json").read_text())["assets"]}
    for symbol in ("AAA", "BBB"):
        assert torch.equal(c["asset_emb.weight"][ids[symbol]], p["asset_emb.weight"][old[symbol]])
    mean = p["asset_emb.weight"][[old["AAA"], old["BBB"]]].mean(dim=0)
    assert torch.allclose(c["asset_emb.weight"][ids["CCC"]], mean)
    assert not torch.allclose(c["asset_emb.weight"][ids["EEE"]], mean)  # fresh init
    assert torch.equal(c["wte.weight"], p["wte.weight"])
    # ... while the blocks trained on from the parent's values
    key = "blocks.0.mlp.fc.weight"
    assert not torch.equal(c[key], p[key]) and (c[key] - p[key]).abs().max() < 0.2


def test_categories_filter_the_universe_for_a_per_market_run(parent, tmp_path):
    config = make_case(tmp_path, "market", CHILD_UNIVERSE)
    assert (
        main(
            [
                "train",
                "--config",
                str(config),
                "--init-from",
                str(parent / "best_model.pt"),
                "--set",
                "data.categories=fx",
            ]
        )
        == 0
    )
    child = only_run(config)
    assert [a["symbol"] for a in json.loads((child / "asset_info.json").read_text())["assets"]] == ["EEE"]
    assert json.loads((child / "config.json").read_text())["data"]["categories"] == ["fx"]


def test_a_factorized_parent_passes_on_its_trained_head(tmp_path):
    """A new factorized head starts at the train split's unigram; a fine-tuned one must keep
    the parent's trained head instead (the child's unigram, over other assets, differs)."""
    factorized = ["--set", 'model.head="factorized"']
    pconfig = make_case(tmp_path / "p", "fparent", PARENT_UNIVERSE, learning_rate=1e-2)
    assert main(["train", "--config", str(pconfig), *factorized]) == 0
    parent = only_run(pconfig)
    config = make_case(tmp_path / "c", "fchild", CHILD_UNIVERSE, learning_rate=1e-12)  # the weights stay put
    assert main(["train", "--config", str(config), "--init-from", str(parent), *factorized]) == 0
    p, c = weights(parent / "best_model.pt"), weights(only_run(config) / "checkpoint_epoch_1.pt")
    head = [k for k in p if k.startswith("head.")]
    assert head
    for k in head:
        torch.testing.assert_close(c[k], p[k], atol=1e-6, rtol=0, msg=k)


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("model.vocab_size=128", "model.vocab_size = 128, the parent's tokenizer has 64 ids"),
        (
            "tokenizer.shape_bins=4",
            "tokenizer.shape_bins = 4, the parent's is 8; fine-tuning keeps the parent's tokenizer",
        ),
        ("model.d_model=64", "model.d_model = 64, the parent's is 32"),
        ('model.positional="rope"', "model.positional = 'rope', the parent's is 'learned'"),
    ],
)
def test_a_different_vocabulary_refit_or_shape_is_refused_with_the_reason(parent, tmp_path, capsys, override, fragment):
    config = make_case(tmp_path, "bad", CHILD_UNIVERSE)
    assert main(["train", "--config", str(config), "--init-from", str(parent), "--set", override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0]
    assert not list((config.parent.parent / "checkpoints").glob("bad_*/config.json"))


def test_a_parent_made_before_a_model_key_existed_is_compared_at_that_keys_default(parent, tmp_path, capsys):
    # a case config turning rotary positions on, a parent whose config.json never named them
    old = tmp_path / "old_parent"
    shutil.copytree(parent, old)
    cfg = json.loads((old / "config.json").read_text())
    del cfg["model"]["positional"]
    (old / "config.json").write_text(json.dumps(cfg))
    config = make_case(tmp_path, "newer", CHILD_UNIVERSE)
    assert main(["train", "--config", str(config), "--init-from", str(old), "--set", 'model.positional="rope"']) == 2
    assert "model.positional = 'rope', the parent's is 'learned'" in capsys.readouterr().err


def test_init_from_nowhere_is_one_line(tmp_path, capsys):
    config = make_case(tmp_path, "lost", CHILD_UNIVERSE)
    assert main(["train", "--config", str(config), "--init-from", str(tmp_path / "nope")]) == 2
    assert "no such run folder or checkpoint file" in capsys.readouterr().err


def test_resume_auto_continues_the_fine_tuning_run_without_the_parent(parent, tmp_path):
    parent_copy = tmp_path / "parent_copy"
    shutil.copytree(parent, parent_copy)
    config = make_case(tmp_path, "resumed", CHILD_UNIVERSE, epochs=2, max_steps_per_epoch=2)
    overrides = [f"training.init_from={parent_copy / 'best_model.pt'}"]
    assert run_training(config, overrides, stop_after_steps=3) == 0  # a step checkpoint, then stopped
    child = only_run(config)
    (parent_copy / "best_model.pt").unlink()  # a re-initialization from the parent would now fail
    assert run_training(config, overrides, resume="auto") == 0
    assert only_run(config) == child
    log = json.loads((child / "training_log.json").read_text())
    assert log["status"] == "finished" and len(log["resumes"]) == 1
    assert log["lineage"]["checkpoint"].endswith("best_model.pt")


def test_freeze_all_but_last_n_leaves_no_gradient_and_no_weight_decay():
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=64,
        context_length=8,
        d_model=32,
        num_layers=3,
        num_heads=2,
        d_ff=64,
        asset_embed_dim=4,
        category_embed_dim=4,
    )
    model = MarketGPT(cfg, num_assets=2, num_categories=1)
    frozen = apply_freeze(model, "all_but_last_1")
    assert "blocks.0.attn.qkv.weight" in frozen and "blocks.1.mlp.fc.weight" in frozen
    assert not any(name.startswith(("blocks.2.", "ln_f.")) for name in frozen)
    assert model.wte.weight.requires_grad  # tied to the output head, which trains
    opt = model.configure_optimizer(0.1, 1e-3, (0.9, 0.95), "cpu")
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert not any(id(named[n]) in in_opt for n in frozen)  # no update, so no weight decay either
    before = {n: p.detach().clone() for n, p in named.items()}
    idx = torch.randint(4, 64, (2, 8))
    _, loss = model(idx, torch.tensor([0, 1]), torch.tensor([0, 0]), targets=idx)
    loss.backward()
    opt.step()
    for n, p in named.items():
        if n in frozen:
            assert p.grad is None and torch.equal(p, before[n])
    assert not torch.equal(named["blocks.2.mlp.fc.weight"], before["blocks.2.mlp.fc.weight"])

    embeddings = apply_freeze(MarketGPT(cfg, num_assets=2, num_categories=1), "embeddings")
    assert set(embeddings) == {"wte.weight", "wpe.weight", "asset_emb.weight", "category_emb.weight"}


@pytest.mark.slow
@pytest.mark.enable_socket
def test_fine_tuning_under_two_ddp_ranks(parent, tmp_path):
    config = make_case(tmp_path, "ddpft", CHILD_UNIVERSE, freeze="embeddings", batch_size=4)
    ranks = start_ranks(2, train_command("--config", config, "--init-from", parent, "--num-gpus", "2"))
    outs = [r.communicate(timeout=300) for r in ranks]
    assert [r.returncode for r in ranks] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    assert "DDP: 2 processes (gloo)" in outs[0][0]
    child = only_run(config)
    log = json.loads((child / "training_log.json").read_text())
    assert log["world_size"] == 2 and log["status"] == "finished"
    assert log["lineage"]["assets_from_category_mean"] == ["CCC"]
    p, c = weights(parent / "best_model.pt"), weights(child / "checkpoint_epoch_1.pt")
    assert torch.equal(c["wte.weight"], p["wte.weight"])  # frozen on both ranks
    assert not torch.equal(c["blocks.1.mlp.fc.weight"], p["blocks.1.mlp.fc.weight"])


def test_data_prepare_makes_the_shard_a_fine_tuning_run_reuses(parent, tmp_path, capsys):
    config = make_case(tmp_path, "child", CHILD_UNIVERSE)
    init = f'training.init_from="{parent}"'
    assert main(["data", "prepare", "--config", str(config), "--set", init]) == 0
    assert "Token shards: prepared" in capsys.readouterr().out
    assert main(["train", "--config", str(config), "--init-from", str(parent)]) == 0
    assert "Token shards: reusing" in capsys.readouterr().out  # the parent's token ids: the same shard
    assert main(["data", "prepare", "--config", str(config), "--set", init, "--array", "2"]) == 2
    assert "fine-tuning" in capsys.readouterr().err
