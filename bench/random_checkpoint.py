"""A small randomly initialised Qwen3 checkpoint in Hugging Face layout, built from nothing that must be downloaded.

    python bench/random_checkpoint.py OUT_DIR [--corpus beir:scifact] [--vocab-size 8192] [--hidden-size 512] ...

The vLLM proof on a GPU machine (`bench/vllm_gpu_proof.py`) needs a model that vLLM serves through its real
code path (Qwen3ForCausalLM: paged attention, prefix caching, a chat template, structured outputs) on a machine
that cannot reach the Hub. This writes one:

- `tokenizer.json`: a byte-level BPE trained with `tokenizers` on the corpus text, with Qwen's chat special tokens;
- `tokenizer_config.json`: a ChatML chat template (the one Qwen models use), eos `<|im_end|>`;
- `config.json` / `generation_config.json`: a Qwen3 architecture of the given size;
- `model.safetensors`: float16 weights drawn from N(0, 0.02) with a fixed seed (norms at 1), under Qwen3's names.

Its answers are noise, by design: the proof measures throughput and the job's bookkeeping, not quality.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML, as Qwen's templates render it; `enable_thinking` is accepted and ignored (Ray Data LLM passes it).
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def first_docs(source: str, limit: int | None = None) -> list[dict]:
    """The first `limit` valid documents ({_id, title, text}) of a corpus: beir:NAME, a folder, .jsonl[.gz], .parquet."""
    from itertools import islice

    from sira.core.datasets import RecordError, parse_record, resolve_corpus

    def valid():
        for raw in resolve_corpus(source).records():
            try:
                doc_id, title, text = parse_record(raw)
            except RecordError:  # what ingest would reject is no tokenizer text either
                continue
            yield {"_id": doc_id, "title": title, "text": text}

    return list(islice(valid(), limit))


def document_texts(docs: Iterable[dict]) -> Iterator[str]:
    return (f"{d.get('title') or ''} {d.get('text') or ''}".strip() for d in docs)


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def qwen3_config(vocab_size: int, hidden_size: int, layers: int, heads: int, kv_heads: int, head_dim: int,
                 intermediate_size: int, max_positions: int, eos_id: int, bos_id: int) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab_size,
        "hidden_size": hidden_size, "intermediate_size": intermediate_size, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "hidden_act": "silu", "max_position_embeddings": max_positions, "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0, "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": None,
        "max_window_layers": layers, "initializer_range": 0.02, "use_cache": True,
        "bos_token_id": bos_id, "eos_token_id": eos_id, "torch_dtype": "float16",
    }


def qwen3_weights(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Qwen3ForCausalLM's tensors (tied embeddings: no lm_head), as the Hugging Face checkpoint names them."""
    rng = np.random.default_rng(seed)
    hidden, inter, head_dim = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q_out, kv_out = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim

    def normal(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * config["initializer_range"]).astype(np.float16)

    def ones(n):
        return np.ones(n, dtype=np.float16)

    tensors = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden), "model.norm.weight": ones(hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": ones(hidden), p + "post_attention_layernorm.weight": ones(hidden),
            p + "self_attn.q_proj.weight": normal(q_out, hidden), p + "self_attn.k_proj.weight": normal(kv_out, hidden),
            p + "self_attn.v_proj.weight": normal(kv_out, hidden), p + "self_attn.o_proj.weight": normal(hidden, q_out),
            p + "self_attn.q_norm.weight": ones(head_dim), p + "self_attn.k_norm.weight": ones(head_dim),
            p + "mlp.gate_proj.weight": normal(inter, hidden), p + "mlp.up_proj.weight": normal(inter, hidden),
            p + "mlp.down_proj.weight": normal(hidden, inter),
        })
    return tensors


def build(out_dir: str | Path, texts: Iterable[str], vocab_size: int = 8192, hidden_size: int = 512, layers: int = 8,
          heads: int = 8, kv_heads: int = 4, head_dim: int = 64, intermediate_size: int = 1536,
          max_positions: int = 8192, seed: int = 0) -> tuple[dict, int]:
    """Write the checkpoint to `out_dir`; returns its config.json and its number of parameters."""
    from safetensors.numpy import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(texts, vocab_size)
    tokenizer.save(str(out / "tokenizer.json"))
    eos_id, bos_id = tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")
    # Embedding rows padded to a multiple of 64, as real checkpoints do; the extra rows are never produced.
    rows = -(-tokenizer.get_vocab_size() // 64) * 64
    config = qwen3_config(rows, hidden_size, layers, heads, kv_heads, head_dim, intermediate_size, max_positions,
                          eos_id, bos_id)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": bos_id, "eos_token_id": eos_id}) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_positions, "chat_template": CHAT_TEMPLATE,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
    }, indent=2) + "\n")
    tensors = qwen3_weights(config, seed)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return config, sum(t.size for t in tensors.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--corpus", default="beir:scifact", help="text the tokenizer is trained on")
    parser.add_argument("--corpus-docs", type=int, default=None, help="train the tokenizer on the first N documents")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    texts = document_texts(first_docs(args.corpus, args.corpus_docs))
    config, params = build(args.out_dir, texts, vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                           layers=args.layers, seed=args.seed)
    print(f"wrote {args.out_dir}: Qwen3, {config['num_hidden_layers']} layers, hidden {config['hidden_size']}, "
          f"vocab {config['vocab_size']}, {params / 1e6:.1f}M parameters", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    raise SystemExit(main())
