"""The local backend's constrained decoding: llama.cpp's grammar sampler against `_GrammarOnTopTokens`.

    python bench/grammar_fallback_speed.py [--docs 8] [--dataset scifact] [--task fact_check]
                                           [--output-json bench/results/grammar_fallback_speed.json]

`sira enrich --backend local` decodes a document under the JSON-schema grammar only when free decoding did not
give a parseable list (the fallback). This decodes the first `--docs` documents' prompts under the grammar both
ways, one single-thread engine as in each actor of the job, alternating the two per document, each decode from
an empty KV cache (so both evaluate the prompt alike and the comparison is exact): generated tokens/s of each,
their ratio, and on how many documents the two texts are identical (they should all be: same seeded sampling).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before llama.cpp's OpenMP runtime loads

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--dataset", default="scifact")
    parser.add_argument("--task", default="fact_check")
    parser.add_argument("--output-json", default=str(REPO_ROOT / "bench/results/grammar_fallback_speed.json"))
    args = parser.parse_args(argv)

    from random_checkpoint import first_docs  # noqa: E402 (bench/ is on sys.path when run as a script)

    from sira.pipelines.enrichment.backend_config import BackendConfig
    from sira.pipelines.enrichment.local_llm import LocalLLMActor
    from sira.core.enrichment import document_input, load_template

    template = load_template("doc", args.task)
    docs = first_docs(f"beir:{args.dataset}", args.docs)
    actor = LocalLLMActor(BackendConfig(backend="local").model_dump_json(), threads=1)
    totals = {name: {"tokens": 0, "seconds": 0.0} for name in ("llama_cpp_grammar_sampler", "grammar_on_top_tokens")}
    rows = []
    for doc in docs:
        prompt = template.render(document_input(doc.get("title") or "", doc.get("text") or ""), 3)
        texts = {}
        for name, on_top in (("llama_cpp_grammar_sampler", False), ("grammar_on_top_tokens", True)):
            actor.grammar_on_top_tokens = on_top
            actor.llm.reset()  # an empty KV cache: both evaluate the whole prompt in one batch
            started = time.perf_counter()
            text, _, _, tokens = actor._complete(prompt, grammar=actor.grammar)
            seconds = time.perf_counter() - started
            totals[name]["tokens"] += tokens
            totals[name]["seconds"] += seconds
            texts[name] = text
        rows.append({"doc_id": doc["_id"], "tokens": tokens, "identical": len(set(texts.values())) == 1})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    for t in totals.values():
        t["output_tokens_per_second"] = t["tokens"] / t["seconds"]
    report = {
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python bench/grammar_fallback_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_average": os.getloadavg()},
        "documents": len(rows), "identical": sum(r["identical"] for r in rows), "totals": totals,
        "speedup_output_tokens_per_second": totals["grammar_on_top_tokens"]["output_tokens_per_second"]
        / totals["llama_cpp_grammar_sampler"]["output_tokens_per_second"],
        "rows": rows,
    }
    Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output_json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    for name, t in totals.items():
        print(f"{name:28} {t['tokens']:>6} tokens {t['seconds']:>7.1f} s {t['output_tokens_per_second']:>7.2f} tok/s")
    print(f"speed-up {report['speedup_output_tokens_per_second']:.2f}x; identical texts on {report['identical']} of "
          f"{report['documents']} documents")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    raise SystemExit(main())
