"""all-MiniLM-L6-v2 in numpy: a 6-layer BERT encoder, mean pooling and L2 normalisation.

The forward pass follows ``transformers``' ``BertModel`` (post-layer-norm, exact GELU, absolute
positions, token type 0) and sentence-transformers' pipeline for this model: truncate to 256
word pieces, mean-pool the last hidden states over real tokens, then L2-normalise. Batches are
sorted by length and padded per batch, with padding masked out of attention and pooling.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

__all__ = ["MiniLMModel"]

F32 = NDArray[np.float32]

_LAYERS = 6
_HEADS = 12
_HIDDEN = 384
_EPS = 1e-12
MAX_TOKENS = 256
"""sentence-transformers' ``max_seq_length`` for this model (``sentence_bert_config.json``)."""


def _erf(x: F32) -> F32:
    # Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7); numpy has no erf and exact GELU needs one.
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t
    out: F32 = (sign * (1.0 - poly * np.exp(-a * a))).astype(np.float32)
    return out


def _gelu(x: F32) -> F32:
    out: F32 = (0.5 * x * (1.0 + _erf(x * np.float32(1.0 / math.sqrt(2.0))))).astype(np.float32)
    return out


def _layer_norm(x: F32, weight: F32, bias: F32) -> F32:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    out: F32 = ((x - mu) / np.sqrt(var + _EPS) * weight + bias).astype(np.float32)
    return out


class MiniLMModel:
    """The encoder and its tokenizer, loaded from a sentence-transformers model folder."""

    def __init__(self, model_dir: Path) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self._counter = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._counter.no_padding()
        self._counter.no_truncation()
        self.max_tokens = MAX_TOKENS
        w = load_file(str(model_dir / "model.safetensors"))
        self._word = w["embeddings.word_embeddings.weight"]
        self._pos = w["embeddings.position_embeddings.weight"]
        self._type0 = w["embeddings.token_type_embeddings.weight"][0]
        self._emb_ln = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self._layers = []
        for i in range(_LAYERS):
            p = f"encoder.layer.{i}."
            # Fuse Q, K and V into one (384, 1152) matmul; keep weights transposed for x @ W.
            qkv_w = np.concatenate(
                [w[p + f"attention.self.{n}.weight"] for n in ("query", "key", "value")], axis=0
            ).T.copy()
            qkv_b = np.concatenate([w[p + f"attention.self.{n}.bias"] for n in ("query", "key", "value")])
            self._layers.append(
                (
                    qkv_w,
                    qkv_b,
                    w[p + "attention.output.dense.weight"].T.copy(),
                    w[p + "attention.output.dense.bias"],
                    (w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"]),
                    w[p + "intermediate.dense.weight"].T.copy(),
                    w[p + "intermediate.dense.bias"],
                    w[p + "output.dense.weight"].T.copy(),
                    w[p + "output.dense.bias"],
                    (w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"]),
                )
            )

    def count(self, text: str) -> int:
        """Word pieces of ``text``, special tokens included, before truncation."""
        return len(self._counter.encode(text).ids)

    def embed(self, texts: list[str], *, batch_size: int = 32, max_batch_tokens: int = 2048) -> F32:
        """L2-normalised sentence embeddings, shape ``(len(texts), 384)``.

        Texts are sorted by length and batched up to ``batch_size`` texts or ``max_batch_tokens``
        padded tokens, whichever is smaller, which bounds memory for long texts.
        """
        out = np.zeros((len(texts), _HIDDEN), dtype=np.float32)
        if not texts:
            return out
        ids = [e.ids for e in self.tokenizer.encode_batch(texts)]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        start = 0
        while start < len(order):
            width = len(ids[order[min(start + batch_size, len(order)) - 1]])
            size = max(1, min(batch_size, max_batch_tokens // width))
            chunk = order[start : start + size]
            width = max(len(ids[i]) for i in chunk)
            batch = np.zeros((len(chunk), width), dtype=np.int64)
            mask = np.zeros((len(chunk), width), dtype=np.float32)
            for row, i in enumerate(chunk):
                batch[row, : len(ids[i])] = ids[i]
                mask[row, : len(ids[i])] = 1.0
            out[chunk] = self._forward(batch, mask)
            start += size
        return out

    def _forward(self, ids: NDArray[np.int64], mask: F32) -> F32:
        b, t = ids.shape
        hd = _HIDDEN // _HEADS
        x = self._word[ids] + self._pos[:t][None] + self._type0
        x = _layer_norm(x.astype(np.float32), *self._emb_ln)
        bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]  # (b, 1, 1, t)
        scale = np.float32(1.0 / math.sqrt(hd))
        for qkv_w, qkv_b, o_w, o_b, ln1, i_w, i_b, f_w, f_b, ln2 in self._layers:
            qkv = (x @ qkv_w + qkv_b).reshape(b, t, 3, _HEADS, hd).transpose(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]  # (b, heads, t, hd)
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + bias
            scores -= scores.max(-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(-1, keepdims=True)
            ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, t, _HIDDEN)
            x = _layer_norm(x + (ctx @ o_w + o_b), *ln1)
            x = _layer_norm(x + (_gelu(x @ i_w + i_b) @ f_w + f_b), *ln2)
        pooled = (x * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        out: F32 = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
        return out
