"""The `vllm` backend end to end on a GPU: `sira enrich --backend vllm` against vLLM's own offline generate.

    python bench/vllm_gpu_proof.py [--docs 3000] [--output-tokens 128] [--corpus beir:scifact]
                                   [--workdir /tmp/sira-vllm-proof] [--output-json bench/results/vllm_gpu_proof.json]

Needs a CUDA GPU and the `gpu` extra (`pip install -e '.[gpu]'`: Ray Data LLM and vLLM); nothing is downloaded.
One prepared run, so it fits a short lease on a lent GPU machine:

1. a randomly initialised Qwen3 checkpoint is built locally (`bench/random_checkpoint.py`: BPE tokenizer trained
   on the corpus, ChatML template, float16 weights from a fixed seed), since no weights can be fetched there;
2. the first `--docs` documents of the corpus are ingested into a fresh warehouse;
3. raw: in a child process, `vllm.LLM.chat` over the job's own prompts (the fact_check template, documents in
   doc-id order, one user turn each), prefix caching on, the same sampling; engine load timed apart;
4. job: `sira enrich --backend vllm --model CHECKPOINT --free-output --sampling-arg ignore_eos=true
   --sampling-arg min_tokens=N --max-tokens N` in a child process (Ray Data LLM, one engine per GPU, Delta
   commits), then once more to show the rerun skips every document;
5. the enrichment table is checked: one row per document, no key twice, N generated tokens per answer.

The output length is fixed (`ignore_eos`, `min_tokens` = `max_tokens`) so both sides generate the same number of
tokens whatever the random weights say; the answers are noise and every row records a parse error, by design.
Reported: generated tokens/s of the job (wall time of the whole command, Ray and engine start included) and of
the raw generate call (with and without its engine load), and their ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

TASK = "fact_check"  # the template enrich_speed.job_prompts renders, passed to the job too
GPU_MEMORY_UTILIZATION = 0.8
MAX_MODEL_LEN = 4096  # what sira.pipelines.enrichment.llm_backends.vllm_processor_config sets


def preflight() -> None:
    """Fail at once, naming what is missing, rather than after the checkpoint and the ingest."""
    try:
        import torch
        import vllm  # noqa: F401
        from ray.data.llm import vLLMEngineProcessorConfig  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"vllm_gpu_proof needs the gpu extra (pip install -e '.[gpu]'): {exc}") from None
    if not torch.cuda.is_available():
        raise SystemExit("vllm_gpu_proof needs a CUDA GPU: torch.cuda.is_available() is False")


def sampling(output_tokens: int) -> dict:
    """The decoding of both sides: the backend's defaults, with the output length fixed."""
    from sira.pipelines.enrichment.backend_config import BackendConfig

    cfg = BackendConfig(backend="vllm", model="-")
    return {"temperature": cfg.temperature, "seed": cfg.seed, "max_tokens": output_tokens, "ignore_eos": True,
            "min_tokens": output_tokens}


def run_raw(model_dir: str, prompts_path: str, output_tokens: int, out_path: str) -> None:
    """Child process: vLLM's offline chat over the prompts; writes its timings as JSON."""
    from vllm import LLM, SamplingParams

    from sira.pipelines.enrichment.llm_backends import chat_messages

    prompts = json.loads(Path(prompts_path).read_text())
    started = time.perf_counter()
    llm = LLM(model=model_dir, enable_prefix_caching=True, max_model_len=MAX_MODEL_LEN,
              gpu_memory_utilization=GPU_MEMORY_UTILIZATION, seed=0)
    load_seconds = time.perf_counter() - started
    params = SamplingParams(**sampling(output_tokens))
    started = time.perf_counter()
    outputs = llm.chat([chat_messages(p) for p in prompts], params, use_tqdm=False,
                       chat_template_kwargs={"enable_thinking": False})
    seconds = time.perf_counter() - started
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    prompt_tokens = sum(len(o.prompt_token_ids or []) for o in outputs)
    Path(out_path).write_text(json.dumps({
        "documents": len(outputs), "input_tokens": prompt_tokens, "output_tokens": generated,
        "load_seconds": load_seconds, "seconds": seconds,
        "output_tokens_per_second": generated / seconds,
        "output_tokens_per_second_with_load": generated / (seconds + load_seconds),
        "docs_per_second": len(outputs) / seconds,
    }))


def sira_enrich(warehouse: str, model_dir: str, output_tokens: int, out_json: str) -> tuple[dict, float]:
    """`sira enrich --backend vllm` as a user runs it; (its --output-json summary, wall seconds)."""
    command = [sys.executable, "-m", "sira.jobs.cli", "enrich", "-w", warehouse, "--backend", "vllm", "--model", model_dir,
               "--task", TASK, "--free-output", "--max-tokens", str(output_tokens),
               "--sampling-arg", "ignore_eos=true", "--sampling-arg", f"min_tokens={output_tokens}",
               "--engine-arg", f"gpu_memory_utilization={GPU_MEMORY_UTILIZATION}",
               "--batch-size", "256", "--commit-every", "1024", "--output-json", out_json]
    print("$", " ".join(command), file=sys.stderr, flush=True)
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=REPO_ROOT)
    return json.loads(Path(out_json).read_text()), time.perf_counter() - started


def check_table(warehouse: str, n_docs: int, output_tokens: int) -> dict:
    from sira.pipelines.storage.delta_io import read_table
    from sira.core import tables

    rows = read_table(tables.table_uri(warehouse, tables.ENRICHMENT))
    rows = rows.to_pandas() if hasattr(rows, "to_pandas") else rows
    keys = rows[["doc_id", "content_hash", "model", "prompt_version"]]
    answered = rows[rows["output_tokens"] > 0]
    return {"rows": len(rows), "documents": n_docs, "distinct_doc_ids": int(rows["doc_id"].nunique()),
            "duplicate_keys": int(keys.duplicated().sum()),
            "rows_with_fixed_output_length": int((answered["output_tokens"] == output_tokens).sum()),
            "inference_errors": int((rows["output_tokens"] == 0).sum()),
            "ok": len(rows) == n_docs and rows["doc_id"].nunique() == n_docs and not keys.duplicated().any()
            and bool((rows["output_tokens"] == output_tokens).all())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=3000)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--corpus", default="beir:scifact")
    parser.add_argument("--hidden-size", type=int, default=1024, help="checkpoint width (heads of 64 dimensions)")
    parser.add_argument("--layers", type=int, default=16, help="checkpoint depth (1024 x 16: about 200M parameters)")
    parser.add_argument("--workdir", default=None, help="default: a temporary folder")
    parser.add_argument("--output-json", default=str(REPO_ROOT / "bench/results/vllm_gpu_proof.json"))
    parser.add_argument("--raw", nargs=3, metavar=("MODEL_DIR", "PROMPTS_JSON", "OUT_JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.raw:
        run_raw(args.raw[0], args.raw[1], args.output_tokens, args.raw[2])
        return 0
    preflight()

    from enrich_speed import job_prompts
    from sira.jobs import ingest as ingest_job
    from random_checkpoint import build, document_texts, first_docs

    work = Path(args.workdir or tempfile.mkdtemp(prefix="sira-vllm-proof-"))
    work.mkdir(parents=True, exist_ok=True)
    docs = first_docs(args.corpus, args.docs)
    model_dir = str(work / "qwen3-random")
    started = time.perf_counter()
    config, parameters = build(model_dir, document_texts(docs),
                               hidden_size=args.hidden_size, layers=args.layers, heads=args.hidden_size // 64,
                               kv_heads=max(1, args.hidden_size // 128), head_dim=64,
                               intermediate_size=3 * args.hidden_size)
    build_seconds = time.perf_counter() - started
    print(f"checkpoint: {parameters / 1e6:.1f}M parameters in {build_seconds:.1f} s", file=sys.stderr, flush=True)

    source = work / "corpus.jsonl"
    source.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    warehouse = str(work / "warehouse")
    ingest = ingest_job.run(ingest_job.IngestConfig(source=str(source), warehouse=warehouse))

    prompts_path = work / "prompts.json"
    prompts_path.write_text(json.dumps(job_prompts(docs)))
    raw_path = work / "raw.json"
    print(f"raw vLLM chat over {len(docs)} prompts ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, __file__, "--output-tokens", str(args.output_tokens),
                    "--raw", model_dir, str(prompts_path), str(raw_path)], check=True, cwd=REPO_ROOT)
    raw = json.loads(raw_path.read_text())

    job, job_wall = sira_enrich(warehouse, model_dir, args.output_tokens, str(work / "job.json"))
    rerun, rerun_wall = sira_enrich(warehouse, model_dir, args.output_tokens, str(work / "rerun.json"))
    table = check_table(warehouse, ingest["kept"], args.output_tokens)

    job_tps = job["output_tokens"] / job_wall
    report = {
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python bench/vllm_gpu_proof.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "gpu": _gpu_name()},
        "checkpoint": {"architecture": config["architectures"][0], "parameters": parameters,
                       "hidden_size": config["hidden_size"], "layers": config["num_hidden_layers"],
                       "vocab_size": config["vocab_size"], "build_seconds": build_seconds},
        "documents": ingest["kept"], "output_tokens_per_answer": args.output_tokens,
        "raw": raw,
        "job": {**job, "wall_seconds": job_wall, "output_tokens_per_second_wall": job_tps},
        "rerun": {**rerun, "wall_seconds": rerun_wall},
        "table": table,
        "ratio_output_tokens_per_second": job_tps / raw["output_tokens_per_second"],
        "ratio_output_tokens_per_second_vs_raw_with_load": job_tps / raw["output_tokens_per_second_with_load"],
    }
    Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output_json).write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"raw vLLM chat: {raw['output_tokens']} tokens in {raw['seconds']:.1f} s "
          f"({raw['output_tokens_per_second']:.0f} tok/s; {raw['output_tokens_per_second_with_load']:.0f} with its "
          f"{raw['load_seconds']:.0f} s load)")
    print(f"sira enrich --backend vllm: {job['output_tokens']} tokens in {job_wall:.1f} s wall ({job_tps:.0f} tok/s); "
          f"job/raw {report['ratio_output_tokens_per_second']:.2f}, job/raw-with-load "
          f"{report['ratio_output_tokens_per_second_vs_raw_with_load']:.2f}")
    print(f"rerun: {rerun['skipped']} skipped, {rerun['enriched'] + rerun['errors']} asked; table: {table}")
    print(f"wrote {args.output_json}", file=sys.stderr)
    return 0 if table["ok"] and rerun["enriched"] + rerun["errors"] == 0 else 1


def _gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 (a report field, never a failure)
        return None


if __name__ == "__main__":
    raise SystemExit(main())
