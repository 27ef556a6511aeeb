"""MarketGPT: causality, shapes of the case models, learning, conditioning, save/load, sampling."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from common.cli import main
from common.config import ModelConfig, load_config
from common.model.dropout import Dropout
from common.model.gpt import MarketGPT, apply_rotary, rotary_tables
from common.model.sampling import SamplingSettings, sample_paths
from common.model.sizing import describe_model
from common.paths import REPO_ROOT
from common.special_tokens import BOS_TOKEN, NUM_SPECIAL_TOKENS, PAD_TOKEN
from common.tokens.features import MARKET_BINS, MARKET_COLUMNS, feature_columns

torch.set_num_threads(1)  # a shared 2-core box; these models are tiny anyway

# (assets, categories) per case, as in the seed guide
CASE_SIZES = {"case_a_full_market": (600, 5), "case_b_reduced": (100, 4), "case_c_crypto": (20, 1)}
CASE_CONFIGS = sorted(REPO_ROOT.glob("case_*/configs/*.json"))
CRYPTO_CONFIG = REPO_ROOT / "case_c_crypto/configs/crypto_prototype.json"


def tiny_config(**changes) -> ModelConfig:
    base = dict(
        vocab_size=32,
        context_length=16,
        d_model=32,
        num_layers=2,
        num_heads=4,
        d_ff=64,
        dropout=0.0,
        asset_embed_dim=8,
        category_embed_dim=4,
        positional="learned",
        bias=False,
    )
    base.update(changes)
    return ModelConfig(**base)


def tiny_model(seed: int = 0, num_assets: int = 3, num_categories: int = 2, **changes) -> MarketGPT:
    torch.manual_seed(seed)
    return MarketGPT(tiny_config(**changes), num_assets=num_assets, num_categories=num_categories).eval()


def random_tokens(B: int, T: int, vocab: int = 32, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(NUM_SPECIAL_TOKENS, vocab, (B, T), generator=g)


def ids(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


def expected_parameters(m: ModelConfig, num_assets: int, num_categories: int) -> int:
    """Counted by hand from the architecture (bias=False): an independent check of the model."""
    C = m.d_model
    per_layer = 2 * C + 4 * C * C + 2 * C * m.d_ff  # two LayerNorm weights, qkv + proj, fc + proj
    positions = m.context_length * C if m.positional == "learned" else 0
    cond = num_assets * m.asset_embed_dim + num_categories * m.category_embed_dim
    cond += (m.asset_embed_dim + m.category_embed_dim) * C  # projection into d_model
    market = (MARKET_COLUMNS + m.reads_peer) * (MARKET_BINS + 1) * C if m.market_context else 0  # a table per id
    return m.vocab_size * C + positions + cond + market + m.num_layers * per_layer + C  # + final LayerNorm


# the recipe's options together (bench/bench_recipe.py): rotary, RMSNorm, QK-norm, SwiGLU
RECIPE = {"positional": "rope", "norm": "rms", "qk_norm": True, "mlp": "swiglu"}


@pytest.mark.parametrize("changes", [{"positional": "learned"}, {"positional": "rope"}, RECIPE], ids=str)
def test_causal_mask_future_tokens_do_not_change_past_logits(changes):
    model = tiny_model(**changes)
    idx = random_tokens(2, 16)
    changed = idx.clone()
    t = 9
    changed[:, t + 1 :] = random_tokens(2, 16 - t - 1, seed=7)
    assert not torch.equal(changed, idx)
    a, c = ids(0, 2), ids(1, 0)
    with torch.no_grad():
        before, _ = model(idx, a, c)
        after, _ = model(changed, a, c)
    assert before.shape == (2, 16, 32)
    torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], rtol=0, atol=1e-6)
    assert not torch.allclose(after[:, t + 1 :], before[:, t + 1 :])  # the future does see the change


@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_recipe_options_have_the_parameters_counted_by_hand(mlp, qk_norm):
    m = tiny_config(norm="rms", qk_norm=qk_norm, mlp=mlp, d_ff=96)
    model = MarketGPT(m, num_assets=3, num_categories=2)
    hidden = 64 if mlp == "swiglu" else 96  # 2/3 of d_ff, a multiple of 8
    mlp_params = (3 if mlp == "swiglu" else 2) * m.d_model * hidden
    gelu_mlp = 2 * m.d_model * m.d_ff
    qk = 2 * (m.d_model // m.num_heads) if qk_norm else 0  # one scale per head dimension, q and k
    base = expected_parameters(m, 3, 2)  # RMSNorm has LayerNorm's one weight (bias=False)
    assert model.num_parameters() == base + m.num_layers * (mlp_params - gelu_mlp + qk)


def test_rope_model_depends_on_order_and_has_no_position_table():
    model = tiny_model(positional="rope")
    assert model.wpe is None
    idx = random_tokens(1, 8)
    with torch.no_grad():
        logits, _ = model(idx, ids(0), ids(0))
        flipped, _ = model(idx.flip(1), ids(0), ids(0))
    # the last position sees the same set of tokens in a different order
    assert not torch.allclose(logits[:, -1], flipped[:, -1])


def test_rotary_scores_depend_only_on_relative_position():
    cos, sin = rotary_tables(context_length=16, head_size=8)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(8, generator=g), torch.randn(8, generator=g)

    def at(x: torch.Tensor) -> torch.Tensor:  # (16, 8): x at every position
        return apply_rotary(x.expand(1, 1, 16, 8), cos, sin)[0, 0]

    rq, rk = at(q), at(k)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm().expand(16))  # a rotation keeps the norm
    torch.testing.assert_close(rq[5] @ rk[2], rq[12] @ rk[9])  # same distance, same score
    assert not torch.allclose(rq[5] @ rk[2], rq[5] @ rk[4])


def test_gpt2_init_scales_residual_projections():
    model = tiny_model(d_model=64, d_ff=256, num_layers=8)
    assert abs(model.blocks[0].attn.qkv.weight.std().item() - 0.02) < 0.002
    for proj in (model.blocks[0].attn.proj, model.blocks[0].mlp.proj):
        assert abs(proj.weight.std().item() - 0.02 / 4) < 0.0005  # 0.02 / sqrt(2 * 8 layers)


@pytest.mark.parametrize("path", CASE_CONFIGS, ids=lambda p: p.parent.parent.name)
def test_case_configs_build_on_meta_with_right_shapes(path):
    cfg = load_config(path)
    m = cfg.model
    num_assets, num_categories = CASE_SIZES[path.parent.parent.name]
    with torch.device("meta"):
        model = MarketGPT(cfg.model, num_assets=num_assets, num_categories=num_categories)
        columns = feature_columns(m.vol_level_input, m.market_context, m.reads_peer)
        features = torch.zeros(2, m.context_length, columns, dtype=torch.long) if m.reads_features else None
        logits, loss = model(
            torch.zeros(2, m.context_length, dtype=torch.long),
            ids(0, 1),
            ids(0, 0),
            targets=torch.zeros(2, m.context_length, dtype=torch.long),
            features=features,
        )
    assert logits.shape == (2, m.context_length, m.vocab_size) and loss.shape == ()
    assert model.wte.weight.shape == (m.vocab_size, m.d_model)
    assert model.lm_head.weight is model.wte.weight
    if m.positional == "learned":
        assert model.wpe.weight.shape == (m.context_length, m.d_model)
    else:
        assert model.wpe is None and model.rope_cos.shape[0] >= m.context_length
    assert model.asset_emb.weight.shape == (num_assets, m.asset_embed_dim)
    assert model.category_emb.weight.shape == (num_categories, m.category_embed_dim)
    assert len(model.blocks) == m.num_layers
    assert model.blocks[0].mlp.fc.weight.shape == (m.d_ff, m.d_model)
    total = model.num_parameters()
    assert total == expected_parameters(m, num_assets, num_categories)
    assert 0 < model.num_parameters(non_embedding=True) < total
    print(
        f"{path.parent.parent.name}: {total:,} parameters ({model.num_parameters(non_embedding=True):,} non-embedding)"
    )


def test_seed_call_and_import_path():
    from common.market_gpt_multi import MarketGPTMultiAsset

    assert MarketGPTMultiAsset is MarketGPT
    with torch.device("meta"):
        model = MarketGPT(tiny_config())  # the seed's `MarketGPT(config)`: one asset, one category
        whole = MarketGPT(load_config(CRYPTO_CONFIG))  # a whole Config uses its model section
    assert model.asset_emb.num_embeddings == 1 and model.category_emb.num_embeddings == 1
    assert whole.config.d_model == 256


def test_overfits_one_batch():
    model = tiny_model(seed=3).train()
    idx = random_tokens(4, 17, seed=5)
    x, y = idx[:, :-1], idx[:, 1:]
    a, c = ids(0, 1, 2, 0), ids(0, 1, 1, 0)
    opt = model.configure_optimizer(weight_decay=0.0, learning_rate=1e-2, betas=(0.9, 0.95), device_type="cpu")
    _, first = model(x, a, c, targets=y)
    for _ in range(150):
        _, loss = model(x, a, c, targets=y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    assert first.item() > 3.0  # about log(32) at init
    assert loss.item() < 0.05


def test_asset_and_category_embeddings_change_the_output():
    model = tiny_model()
    idx = random_tokens(1, 8).repeat(2, 1)  # the same tokens twice
    with torch.no_grad():
        by_asset, _ = model(idx, ids(0, 1), ids(0, 0))
        by_category, _ = model(idx, ids(0, 0), ids(0, 1))
    assert not torch.allclose(by_asset[0], by_asset[1])
    assert not torch.allclose(by_category[0], by_category[1])
    torch.testing.assert_close(by_asset[0], by_category[0])  # same ids, same logits


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_state_dict_round_trip_gives_identical_logits(positional):
    model = tiny_model(seed=0, positional=positional)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert not any("rope" in key for key in state)  # derived buffers stay out of checkpoints

    fresh = tiny_model(seed=1, positional=positional)
    idx, a, c = random_tokens(2, 12), ids(2, 1), ids(1, 0)
    with torch.no_grad():
        assert not torch.allclose(fresh(idx, a, c)[0], model(idx, a, c)[0])
        fresh.load_state_dict(state)
        assert torch.equal(fresh(idx, a, c)[0], model(idx, a, c)[0])
    assert fresh.lm_head.weight is fresh.wte.weight  # loading keeps the tie


def test_pad_targets_are_ignored_by_the_loss():
    model = tiny_model()
    idx = random_tokens(2, 10)
    targets = random_tokens(2, 10, seed=9)
    targets[0, :4] = PAD_TOKEN
    targets[1, 7:] = PAD_TOKEN
    with torch.no_grad():
        logits, loss = model(idx, ids(0, 1), ids(0, 1), targets=targets)
    keep = targets != PAD_TOKEN
    expected = F.cross_entropy(logits[keep], targets[keep])
    torch.testing.assert_close(loss, expected)
    everything = F.cross_entropy(logits.reshape(-1, 32), targets.reshape(-1))  # PAD counted as a class
    assert not torch.allclose(loss, everything)


def test_sequence_longer_than_context_is_a_clear_error():
    model = tiny_model()
    with pytest.raises(ValueError, match="exceeds model.context_length 16"):
        model(random_tokens(1, 17), ids(0), ids(0))


def test_last_only_matches_the_full_forward():
    model = tiny_model()
    idx = random_tokens(3, 11)
    with torch.no_grad():
        full, _ = model(idx, ids(0, 1, 2), ids(0, 0, 1))
        last, _ = model(idx, ids(0, 1, 2), ids(0, 0, 1), last_only=True)
    assert last.shape == (3, 1, 32)
    torch.testing.assert_close(last[:, 0], full[:, -1])


def never_pad_or_bos(vocab: int) -> torch.Tensor:
    banned = torch.zeros(vocab, dtype=torch.bool)
    banned[[PAD_TOKEN, BOS_TOKEN]] = True
    return banned


def test_sample_paths_shapes_crop_and_never_emits_pad_or_bos():
    # vocab 6: 3 specials of 6, so with a flat distribution unmasked specials would show up often
    model = tiny_model(vocab_size=6, context_length=8).train()
    prompt = random_tokens(16, 12, vocab=6)  # longer than the context: sample_paths crops it
    out = sample_paths(
        model,
        prompt,
        ids(*[1] * 16),
        ids(*[0] * 16),
        SamplingSettings(horizon=20, samples=1, temperature=50.0, seed=0),
        banned=never_pad_or_bos(6),
    )
    assert out.shape == (16, 1, 20) and out.dtype == torch.long
    new = out[:, 0]
    assert not torch.isin(new, ids(PAD_TOKEN, BOS_TOKEN)).any()
    assert len(torch.unique(new)) > 2  # high temperature really samples
    assert model.training  # mode restored


def test_sample_paths_top_k_temperature_and_generator():
    model = tiny_model()
    prompt = random_tokens(1, 6)
    a, c, never = ids(1), ids(0), never_pad_or_bos(32)
    with torch.no_grad():
        logits, _ = model(prompt, a, c, last_only=True)
    logits = logits[0, 0]
    logits[[PAD_TOKEN, BOS_TOKEN]] = -float("inf")
    top2 = torch.topk(logits, 2).indices

    def first_token(samples: int, **kw) -> torch.Tensor:
        return sample_paths(model, prompt, a, c, SamplingSettings(1, samples, **kw), banned=never)[0, :, 0]

    sampled = first_token(64, temperature=5.0, top_k=2)
    assert set(sampled.tolist()) <= set(top2.tolist())
    assert len(set(sampled.tolist())) == 2  # at temperature 5 both of the top 2 appear in 64 draws
    greedy = first_token(2, temperature=0.0)
    assert greedy.tolist() == [top2[0].item()] * 2
    top1 = first_token(2, top_k=1)
    assert torch.equal(top1, greedy)

    prompts, a4, c4 = random_tokens(4, 6), ids(2, 2, 2, 2), ids(1, 1, 1, 1)
    one = sample_paths(model, prompts, a4, c4, SamplingSettings(10, 1, seed=42), banned=never)
    two = sample_paths(model, prompts, a4, c4, SamplingSettings(10, 1, seed=42), banned=never)
    assert torch.equal(one, two)


@pytest.mark.parametrize("max_batch", [None, 2], ids=["whole contexts", "a context's samples split"])
def test_each_sample_reads_its_own_future_market_ids(max_batch):
    """path_features: each sample's future market ids (the forecasts' market analogs). A sample
    given ids equal to another run's whole future draws what that run drew for it, row for row."""
    model = tiny_model(market_context=True)
    with torch.no_grad():  # a strong market effect, so a wrong row's ids would show
        for table in model.market_emb:
            table.weight.mul_(50)
    N, S, H, L = 2, 3, 4, 6
    prompts, a, c = random_tokens(N, L), ids(0, 1), ids(0, 1)
    g = torch.Generator().manual_seed(5)
    cols = feature_columns(vol_level=False, market_context=True)
    features = torch.randint(1, 6, (N, L + H, cols), generator=g)
    paths = torch.randint(1, MARKET_BINS + 1, (N, S, H, MARKET_COLUMNS), generator=g)
    paths[:, 0] = features[:, L:, -MARKET_COLUMNS:]  # sample 0 of each context: the shared future

    def draw(feats: torch.Tensor, path: torch.Tensor | None = None) -> torch.Tensor:
        settings = SamplingSettings(H, S, seed=3, max_batch=max_batch)
        return sample_paths(model, prompts, a, c, settings, features=feats, path_features=path)

    own, plain = draw(features, paths), draw(features)
    assert torch.equal(own[:, 0], plain[:, 0])
    moved = []
    for s in range(1, S):
        theirs = features.clone()
        theirs[:, L:, -MARKET_COLUMNS:] = paths[:, s]
        other = draw(theirs)
        assert torch.equal(own[:, s], other[:, s])
        moved.append(not torch.equal(other[:, s], plain[:, s]))
    assert any(moved)  # the future's ids change what is drawn (so a wrong row's would show)


def test_bf16_autocast_forward_with_rope():
    model = tiny_model(positional="rope")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(random_tokens(2, 8), ids(0, 1), ids(0, 1), targets=random_tokens(2, 8, seed=2))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(loss)


def test_dropout_is_a_bernoulli_mask_scaled_by_one_over_keep():
    drop = Dropout(0.1).train()
    torch.manual_seed(0)
    x = torch.ones(1000, 4000, requires_grad=True)  # 4M elements: rate within +-0.0005 (3.3 sigma)
    y = drop(x)
    values = torch.unique(y).tolist()
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(1 / 0.9)
    dropped = (y == 0).double()
    assert dropped.mean().item() == pytest.approx(0.1, abs=5e-4)
    # every lane of the 64-bit draws is uniform: the rate holds at each of the four positions
    lanes = dropped.view(-1, 4).mean(dim=0)
    assert torch.allclose(lanes, torch.full((4,), 0.1, dtype=torch.float64), atol=1e-3), lanes
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # gradient flows through kept entries only, scaled
    assert y.dtype == x.dtype and drop(torch.ones(3, 5, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_dropout_follows_the_torch_seed_and_is_off_in_eval_or_at_zero():
    drop = Dropout(0.5).train()
    x = torch.randn(7, 33)  # numel not a multiple of 4
    torch.manual_seed(3)
    a = drop(x)
    torch.manual_seed(3)
    assert torch.equal(drop(x), a)
    assert not torch.equal(drop(x), a)
    assert drop.eval()(x) is x and Dropout(0.0).train()(x) is x
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.0)


def test_flops_per_token_counts_matmul_weights_and_attention():
    cfg = tiny_config(d_model=32, num_layers=2, d_ff=64, vocab_size=32, context_length=16)
    model = MarketGPT(cfg, num_assets=3, num_categories=2)
    C, L, T = 32, 2, 16
    body = L * (4 * C * C + 2 * C * 64 + 2 * C) + C + (8 + 4) * C  # blocks, ln_f, conditioning projection
    assert model.flops_per_token() == 6 * (body + 32 * C) + 12 * L * T * C
    assert model.flops_per_token(8) == 6 * (body + 32 * C) + 12 * L * 8 * C


def test_optimizer_decays_only_2d_weights():
    model = tiny_model(bias=True)
    opt = model.configure_optimizer(weight_decay=0.1, learning_rate=1e-3, betas=(0.9, 0.95), device_type="cpu")
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert any(p is model.wte.weight for p in decay["params"])
    assert any(p is model.ln_f.bias for p in no_decay["params"])
    n = sum(p.numel() for g in opt.param_groups for p in g["params"])
    assert n == model.num_parameters()  # every parameter once, the tied matrix included once
    assert not opt.defaults["fused"]


def test_describe_model_counts_and_fallback_sizes():
    cfg = load_config(CRYPTO_CONFIG)
    text = describe_model(cfg, num_assets=None, num_categories=None)  # universe_counts: {"crypto": 20}
    expected = expected_parameters(cfg.model, 20, 1)
    assert f"{expected:,} total" in text and "GB" in text
    assert f"{expected_parameters(cfg.model, 7, 3):,} total" in describe_model(cfg, 7, 3)


def test_model_info_cli_in_process(capsys):
    code = main(
        [
            "model-info",
            "--config",
            str(CRYPTO_CONFIG),
            "--num-assets",
            "20",
            "--num-categories",
            "1",
            "--set",
            "model.num_layers=2",
        ]
    )
    out = capsys.readouterr().out
    cfg = load_config(CRYPTO_CONFIG, ["model.num_layers=2"])
    assert code == 0
    assert f"parameters: {expected_parameters(cfg.model, 20, 1):,} total" in out

    assert main(["model-info", "--config", str(CRYPTO_CONFIG), "--num-assets", "0"]) == 2
    assert "--num-assets" in capsys.readouterr().err


def test_model_info_cli_end_to_end():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "common.cli",
            "model-info",
            "--config",
            str(CRYPTO_CONFIG),
            "--num-assets",
            "20",
            "--num-categories",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    expected = expected_parameters(load_config(CRYPTO_CONFIG).model, 20, 1)
    assert f"parameters: {expected:,} total" in result.stdout
