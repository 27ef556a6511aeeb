"""Output heads of MarketGPT: hidden states (.., C) -> logits over the whole vocabulary (.., V).

`model.head` picks one; both give a proper distribution over the same ids (specials included),
so every metric, baseline and sampler reads them the same way (softmax / log_softmax).

- "flat": today's softmax over V unrelated classes, weights tied to the token embedding.
- "factorized": p(token) = p(move bin) * p(shape bin | move bin). A token is a pair of ordered
  quantile bins (see common/tokens/tokenizer.py); the flat head gives each of the move_bins x shape_bins
  pairs its own weight vector, so a rare pair learns from its own few examples. Here the move
  distribution (with the specials as extra classes) pools every shape of a move, and
  p(shape | move) is one shared shape read-out shifted by a learned per-move table, so a big
  move can still ask for a wide candle. Its logits ARE log-probabilities; ids the tokenizer
  never emits get log-probability -1e4 (exp underflows to 0, stays finite in fp16/bf16).
  The input side is structured too: a real token's embedding is its own vector plus a move-bin
  and a shape-bin vector, which every token of that bin shares.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.nn import functional as F

from common.special_tokens import NUM_SPECIAL_TOKENS

__all__ = ["FactorizedHead", "NEVER_LOGPROB"]

NEVER_LOGPROB = -1e4  # log-probability of ids the tokenizer never emits


class FactorizedHead(nn.Module):
    """p(move) * p(shape | move) over ids NUM_SPECIAL_TOKENS + move * shape_bins + shape."""

    move_of: torch.Tensor  # buffers (registered in __init__)
    shape_of: torch.Tensor

    def __init__(self, d_model: int, vocab_size: int, move_bins: int, shape_bins: int) -> None:
        super().__init__()
        S = NUM_SPECIAL_TOKENS
        if S + move_bins * shape_bins > vocab_size:
            raise ValueError(
                f"move_bins {move_bins} x shape_bins {shape_bins} + {S} specials exceed vocab_size {vocab_size}"
            )
        self.vocab_size, self.move_bins, self.shape_bins = vocab_size, move_bins, shape_bins
        self.move_out = nn.Linear(d_model, S + move_bins, bias=True)  # specials + move bins
        self.shape_out = nn.Linear(d_model, shape_bins, bias=True)
        self.move_shape = nn.Parameter(torch.zeros(move_bins, shape_bins))  # p(shape | move)'s per-move shift
        # input side: a token's move and shape bin vectors (index 0: a special or never-emitted id)
        self.move_in = nn.Embedding(move_bins + 1, d_model)
        self.shape_in = nn.Embedding(shape_bins + 1, d_model)
        code = torch.arange(vocab_size) - S
        real = (code >= 0) & (code < move_bins * shape_bins)
        # (V,) 1-based bin of each id, 0 for specials and never-emitted ids; derived, not saved
        self.register_buffer("move_of", torch.where(real, code // shape_bins + 1, 0), persistent=False)
        self.register_buffer("shape_of", torch.where(real, code % shape_bins + 1, 0), persistent=False)

    @torch.no_grad()
    def start_at_unigram(self, counts: torch.Tensor) -> None:
        """Set the output biases so that, before any training, the head predicts the training
        tokens' unigram (counts: (V,) occurrences of each id, add-one smoothed here): the
        flat start is log(S + M) + log(K) nats, which a few hundred steps at a small-data
        learning rate do not unlearn (the biases move about lr per step)."""
        S, M, K = NUM_SPECIAL_TOKENS, self.move_bins, self.shape_bins
        c = counts.double()[: S + M * K] + 1.0
        pair = c[S:].view(M, K)
        move = torch.cat((c[:S], pair.sum(1)))
        self.move_out.bias.copy_(move.log() - move.log().mean())
        self.shape_out.bias.zero_()
        shape = pair.log() - pair.log().mean(1, keepdim=True)
        self.move_shape.copy_(shape)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, C): the bin vectors added to the token's own embedding."""
        return self.move_in(self.move_of[idx]) + self.shape_in(self.shape_of[idx])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(.., C) -> (.., V) log-probabilities."""
        S, M, K = NUM_SPECIAL_TOKENS, self.move_bins, self.shape_bins
        lead = x.shape[:-1]
        log_move = F.log_softmax(self.move_out(x).float(), dim=-1)  # (.., S + M)
        shape = self.shape_out(x).float().unsqueeze(-2) + self.move_shape  # (.., M, K)
        log_pair = log_move[..., S:, None] + F.log_softmax(shape, dim=-1)  # (.., M, K)
        never = log_move.new_full((*lead, self.vocab_size - S - M * K), NEVER_LOGPROB)
        return torch.cat((log_move[..., :S], log_pair.reshape(*lead, M * K), never), dim=-1)
