"""Naive next-token predictors every model metric is reported beside.

Baselines, fit on TRAIN tokens only (`fit_baselines` never sees the test split):
- unigram: train token frequencies with add-one smoothing over every non-PAD id.
- repeat_last: the previous token gets probability 1 - eps, the other non-PAD ids share eps.
  eps is the fraction of train transitions that are not a repeat (its maximum-likelihood value),
  capped at (V-2)/V so the previous token always stays the most likely one.
- markov1: first-order transition counts within each asset's train tokens, Witten-Bell
  smoothed towards the unigram: P(b|a) = (C(a,b) + D(a) u(b)) / (C(a) + D(a)), with D(a) the
  number of distinct successors of a; a token never seen in train backs off to u(b).

Each baseline's `log_probs(prev)` gives (n, V) log-probabilities of the next token from the
previous one, the shape the model's scoring takes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from common.special_tokens import PAD_TOKEN

__all__ = ["BASELINES", "Markov1", "RepeatLast", "Unigram", "fit_baselines"]

BASELINES = ("unigram", "repeat_last", "markov1")


@dataclass
class Unigram:
    """p(b) from train frequencies, add-one smoothed over the non-PAD ids."""

    probs: np.ndarray  # (V,)

    def log_probs(self, prev: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return np.repeat(np.log(self.probs)[None, :], len(prev), axis=0)


@dataclass
class RepeatLast:
    """1 - eps on the previous token, eps shared by the other non-PAD ids."""

    vocab_size: int
    eps: float

    def log_probs(self, prev: np.ndarray) -> np.ndarray:
        out = np.full((len(prev), self.vocab_size), math.log(self.eps / (self.vocab_size - 2)))
        out[:, PAD_TOKEN] = -np.inf
        out[np.arange(len(prev)), prev] = math.log1p(-self.eps)
        return out


@dataclass
class Markov1:
    """Witten-Bell smoothed first-order transitions, backing off to the unigram."""

    counts: np.ndarray  # (V, V) int32: counts[a, b] = train transitions a -> b
    unigram: np.ndarray  # (V,) backoff distribution

    def log_probs(self, prev: np.ndarray) -> np.ndarray:
        c = self.counts[prev].astype(np.float64)  # (n, V)
        total = c.sum(1, keepdims=True)
        distinct = (c > 0).sum(1, keepdims=True)
        unseen = total == 0
        # an unseen previous token gives 0 / 0 here; np.where picks the unigram instead
        with np.errstate(divide="ignore", invalid="ignore"):
            p = np.where(unseen, self.unigram, (c + distinct * self.unigram) / (total + distinct))
            return np.log(p)


def fit_baselines(train_tokens: Mapping[str, np.ndarray], vocab_size: int) -> dict[str, Any]:
    """The three baselines, fit on train tokens only (symbol -> 1-D array of one asset).

    Counted one asset at a time, so memory holds one asset's tokens (as int64) and the V x V
    counts, whatever the corpus: pooled int64 copies cost some 50 bytes a training candle."""
    counts = np.zeros(vocab_size, np.int64)
    # int32 and filled from the distinct pairs: V x V is 64 MB at vocab 4096, not 128
    transitions = np.zeros((vocab_size, vocab_size), np.int32)
    changes = pairs_seen = 0
    for tokens in train_tokens.values():
        seq = np.asarray(tokens).astype(np.int64)
        counts += np.bincount(seq, minlength=vocab_size)
        # transitions inside each asset: the last train token of one asset does not precede the next asset
        prev, nxt = seq[:-1], seq[1:]
        keep = (prev != PAD_TOKEN) & (nxt != PAD_TOKEN)
        prev, nxt = prev[keep], nxt[keep]
        pairs, n = np.unique(prev * vocab_size + nxt, return_counts=True)
        transitions[pairs // vocab_size, pairs % vocab_size] += n.astype(np.int32)
        changes += int(np.count_nonzero(prev != nxt))
        pairs_seen += len(prev)
    counts = counts.astype(np.float64)
    counts[PAD_TOKEN] = 0
    support = np.ones(vocab_size)
    support[PAD_TOKEN] = 0
    unigram = (counts + support) / (counts.sum() + support.sum())

    # eps: the maximum-likelihood value on train, kept above 0 so every loss stays finite and at
    # most (V-2)/V so the last token keeps at least twice any other id's probability: with a
    # rarely repeating train set the ML value would otherwise rank the last token LAST
    eps = changes / pairs_seen if pairs_seen else 0.5
    eps = min(max(eps, 1e-3), (vocab_size - 2) / vocab_size)
    return {
        "unigram": Unigram(unigram),
        "repeat_last": RepeatLast(vocab_size, eps),
        "markov1": Markov1(transitions, unigram),
    }
