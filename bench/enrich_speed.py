"""Enrichment speed of the `local` backend: the real `sira enrich` job against the bare llama.cpp runtime.

    python bench/enrich_speed.py [--docs 40] [--model NAME] [--output-json bench/results/enrich_speed.json]

The first `--docs` scifact documents are ingested into a temporary warehouse. Then, on the same prompts
(the fact_check template, max_n 3, documents in doc-id order, as the job renders them):

- raw: one `llama_cpp.Llama` in this process on all cores, a plain loop of the same model input (chat turns or
  completion text of `sira.pipelines.enrichment.local_llm`), the same sampling (temperature, seed, max_tokens) under llama.cpp's
  JSON-schema grammar, i.e. the bare runtime's own way to get JSON out; model load timed apart, not counted;
- one engine: the job's decoding (free decoding stopped when the list closes, the grammar only as a fallback)
  through one in-process LocalLLMActor on all cores, i.e. the job minus Ray, Delta and the one-engine-per-core
  layout;
- job: `sira.jobs.enrich.run` with `--backend local`: a local Ray instance, Ray Data, the LocalLLMActor (model load
  included), parsing and the Delta commits, i.e. everything a user waits for after `sira enrich` starts.

The raw loop runs before and after the job and the faster raw run is the reference, so load that drifts during
a run counts against the job, not for it. Reported: documents/s and generated tokens/s of each run, and job/raw
for each (target: docs/s ratio >= 0.8).
Both run with OMP_WAIT_POLICY=PASSIVE, as the actor sets it (see pipelines/enrichment/local_llm.py). The machine may be
shared: run it on a quiet one, or compare runs made together.

Encoder proposer (`--encoder-docs N`, default 200): the same job with `--backend encoder` over the first N
scifact documents (after a plain Spark index of them, whose vocabulary it proposes from; the vocabulary is built
and cached first and timed apart), against a raw loop of the same encoder and nearest-entry search in this
process. Reported beside the LLM figures: documents/s of each and their ratio. `--skip-local` measures only it.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before llama.cpp's OpenMP runtime loads

import argparse
import json
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from sira.jobs import enrich as enrich_job  # noqa: E402
from sira.jobs import ingest as ingest_job  # noqa: E402
from sira.pipelines.enrichment.backend_config import BackendConfig  # noqa: E402
from sira.pipelines.enrichment.local_llm import N_CTX, chat_messages, completion_text, resolve_model  # noqa: E402
from sira.core.enrichment import JSON_SCHEMA, document_input, load_template  # noqa: E402

TASK = "fact_check"
MAX_N = 3
TARGET_RATIO = 0.8


def first_docs(n: int) -> list[dict]:
    """The first n scifact documents ({_id, title, text}), read by the one corpus reader of the benches."""
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    from random_checkpoint import first_docs as corpus_docs

    return corpus_docs("beir:scifact", n)


def job_prompts(docs: list[dict]) -> list[str]:
    """The job's order and rendering: documents sorted by doc id, `title. text` cut at 4,000 characters."""
    template = load_template("doc", TASK)
    return [template.render(document_input(d.get("title") or "", d.get("text") or ""), MAX_N)
            for d in sorted(docs, key=lambda d: str(d["_id"]))]


def run_one_engine(prompts: list[str], backend: BackendConfig) -> dict:
    from sira.pipelines.enrichment.local_llm import LocalLLMActor

    started = time.perf_counter()
    actor = LocalLLMActor(backend.model_dump_json(), threads=os.cpu_count())
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    rows = [actor.generate(p) for p in prompts]
    seconds = time.perf_counter() - started
    output_tokens = sum(r["output_tokens"] for r in rows)
    return {"documents": len(prompts), "seconds": seconds, "model_load_seconds": load_s,
            "input_tokens": sum(r["input_tokens"] for r in rows), "output_tokens": output_tokens,
            "errors": sum(r["error"] is not None for r in rows),
            "docs_per_second": len(prompts) / seconds, "output_tokens_per_second": output_tokens / seconds}


def run_raw(prompts: list[str], backend: BackendConfig) -> dict:
    from llama_cpp import Llama, LlamaGrammar

    path, prompt_format = resolve_model(backend.model_id())
    threads = os.cpu_count()
    started = time.perf_counter()
    llm = Llama(model_path=str(path), n_ctx=N_CTX, n_threads=threads, n_threads_batch=threads, seed=backend.seed,
                verbose=False)
    load_s = time.perf_counter() - started
    prompt_format = prompt_format or ("chat" if llm.metadata.get("tokenizer.chat_template") else "completion")
    fewshot = prompt_format.endswith("-fewshot")
    grammar = LlamaGrammar.from_json_schema(json.dumps(JSON_SCHEMA), verbose=False) if backend.structured_output else None
    sampling = {"temperature": backend.temperature, "max_tokens": backend.max_tokens, "seed": backend.seed,
                "grammar": grammar}
    output_tokens = input_tokens = 0
    started = time.perf_counter()
    for prompt in prompts:
        if prompt_format.startswith("chat"):
            out = llm.create_chat_completion(messages=chat_messages(prompt, fewshot), **sampling)
        else:
            out = llm.create_completion(completion_text(prompt, fewshot), stop=None if grammar else ["\n\n"],
                                        **sampling)
        output_tokens += out["usage"]["completion_tokens"]
        input_tokens += out["usage"]["prompt_tokens"]
    seconds = time.perf_counter() - started
    return {"documents": len(prompts), "seconds": seconds, "model_load_seconds": load_s,
            "input_tokens": input_tokens, "output_tokens": output_tokens, "prompt_format": prompt_format,
            "docs_per_second": len(prompts) / seconds, "output_tokens_per_second": output_tokens / seconds}


def run_job(warehouse: str, backend: BackendConfig) -> dict:
    started = time.perf_counter()
    summary = enrich_job.run(enrich_job.EnrichConfig(warehouse=warehouse, backend=backend, task=TASK))
    wall = time.perf_counter() - started
    return {**summary, "wall_seconds": wall}


def run_encoder(n_docs: int) -> dict:
    """`sira enrich --backend encoder` vs a raw encode + nearest-entry loop, on the first n scifact docs."""
    from sira.jobs import index as index_job
    from sira.pipelines.enrichment.encoder_proposer import EncoderProposer, load_vocabulary
    from sira.pipelines.index.catalog import find_index
    from sira.core.analysis import Analyzer, AnalyzerConfig, index_text

    docs = first_docs(n_docs)
    backend = BackendConfig(backend="encoder")
    with tempfile.TemporaryDirectory(prefix="sira-enrich-speed-encoder-") as tmp:
        source = Path(tmp) / "corpus.jsonl"
        source.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
        warehouse = str(Path(tmp) / "scifact")
        ingest_job.run(ingest_job.IngestConfig(source=str(source), warehouse=warehouse))
        index_job.run(index_job.IndexConfig(warehouse=warehouse, preset="sira", shards=1, enrichment=False,
                                            spark_master="local[2]"))
        manifest = find_index(warehouse, enriched=False)
        started = time.perf_counter()
        vocabulary = load_vocabulary(warehouse, manifest, backend.encoder)
        vocabulary_seconds = time.perf_counter() - started
        print(f"sira enrich --backend encoder over {len(docs)} documents ...", file=sys.stderr, flush=True)
        job = run_job(warehouse, backend)
        texts = [index_text(d.get("title") or "", d.get("text") or "") for d in sorted(docs, key=lambda d: str(d["_id"]))]
        proposer = EncoderProposer(vocabulary, backend.encoder,
                                   Analyzer(AnalyzerConfig.model_validate_json(manifest["analyzer_json"])))
        started = time.perf_counter()
        for i in range(0, len(texts), backend.batch_size):
            proposer.propose(texts[i : i + backend.batch_size])
        raw_seconds = time.perf_counter() - started
    raw = {"documents": len(texts), "seconds": raw_seconds, "docs_per_second": len(texts) / raw_seconds}
    return {"vocabulary_entries": len(vocabulary), "vocabulary_seconds": vocabulary_seconds, "job": job, "raw": raw,
            "ratio_docs_per_second": job["docs_per_second"] / raw["docs_per_second"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=40)
    parser.add_argument("--model", default=None, help="packaged model name or GGUF path (default: the local default)")
    parser.add_argument("--output-json", default=str(REPO_ROOT / "bench/results/enrich_speed.json"))
    parser.add_argument("--encoder-docs", type=int, default=200, help="documents for the encoder proposer (0: skip)")
    parser.add_argument("--skip-local", action="store_true", help="measure only the encoder proposer")
    args = parser.parse_args(argv)
    report = {
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python bench/enrich_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_average": os.getloadavg()},
    }
    if not args.skip_local:
        report.update(measure_local(args))
    if args.encoder_docs:
        enc = run_encoder(args.encoder_docs)
        report["encoder"] = enc
        print(f"{'encoder proposer':28} job {enc['job']['documents']:>5} docs {enc['job']['docs_per_second']:>7.2f} docs/s, "
              f"raw {enc['raw']['docs_per_second']:.2f} docs/s, job/raw {enc['ratio_docs_per_second']:.2f}; "
              f"vocabulary {enc['vocabulary_entries']} entries in {enc['vocabulary_seconds']:.1f} s (not counted)")
        if "job" in report:
            print(f"encoder job docs/s / local LLM job docs/s: "
                  f"{enc['job']['docs_per_second'] / report['job']['docs_per_second']:.1f}x")
    Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output_json).write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"wrote {args.output_json}", file=sys.stderr)
    return 0


def measure_local(args) -> dict:

    backend = BackendConfig(backend="local", model=args.model)
    docs = first_docs(args.docs)
    prompts = job_prompts(docs)

    with tempfile.TemporaryDirectory(prefix="sira-enrich-speed-") as tmp:
        source = Path(tmp) / "corpus.jsonl"
        source.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
        warehouse = str(Path(tmp) / "scifact")
        ingest_job.run(ingest_job.IngestConfig(source=str(source), warehouse=warehouse))
        print(f"raw llama.cpp loop over {len(prompts)} prompts ...", file=sys.stderr, flush=True)
        raw_runs = [run_raw(prompts, backend)]
        print(f"sira enrich --backend local over {len(prompts)} documents ...", file=sys.stderr, flush=True)
        job = run_job(warehouse, backend)
        print("raw llama.cpp loop again ...", file=sys.stderr, flush=True)
        raw_runs.append(run_raw(prompts, backend))
        print("one engine, the job's decoding ...", file=sys.stderr, flush=True)
        one_engine = run_one_engine(prompts, backend)
    raw = max(raw_runs, key=lambda r: r["docs_per_second"])

    ratio_docs = job["docs_per_second"] / raw["docs_per_second"]
    ratio_tokens = job["output_tokens_per_second"] / raw["output_tokens_per_second"]
    print(f"{'':28} {'docs':>5} {'seconds':>8} {'docs/s':>7} {'out tokens':>10} {'out tok/s':>9}")
    for name, r in (("raw llama.cpp loop, before", raw_runs[0]), ("sira enrich (local)", job),
                    ("raw llama.cpp loop, after", raw_runs[1]), ("one engine, job's decoding", one_engine)):
        print(f"{name:28} {r['documents']:>5} {r['seconds']:>8.1f} {r['docs_per_second']:>7.3f} "
              f"{r['output_tokens']:>10} {r['output_tokens_per_second']:>9.1f}")
    print(f"job/faster raw: docs/s {ratio_docs:.2f}, output tokens/s {ratio_tokens:.2f} (target docs/s >= {TARGET_RATIO}); "
          f"job errors {job['errors']}, raw model load {raw['model_load_seconds']:.1f} s (not counted)")
    ratio_engine = job["docs_per_second"] / one_engine["docs_per_second"]
    print(f"job/one engine with the job's decoding: docs/s {ratio_engine:.2f} (Ray, Delta and one engine per core)")

    return {
        "llama_cpp_python": metadata.version("llama-cpp-python"),
        "model": backend.model_id(),
        "task": TASK,
        "decoding": backend.model_dump(include={"temperature", "seed", "max_tokens", "structured_output"}),
        "raw": raw,
        "raw_runs": raw_runs,
        "job": job,
        "one_engine": one_engine,
        "ratio_docs_per_second": ratio_docs,
        "ratio_docs_per_second_vs_one_engine": ratio_engine,
        "ratio_output_tokens_per_second": ratio_tokens,
        "target_ratio": TARGET_RATIO,
    }


if __name__ == "__main__":
    sys.exit(main())
