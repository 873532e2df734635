"""Speed of the `local` backend under different llama.cpp builds (e.g. AVX2 only vs AVX-512), same model, same prompts.

    python bench/llama_build_speed.py --build avx2=WHEEL_OR_DIR --build avx512=WHEEL_OR_DIR [--docs 12]

Each `--build` is a llama-cpp-python wheel (as `make env` caches them in ~/.cache/sira/wheels/*/) or a folder
holding an unpacked `llama_cpp` package; `installed` means the one in this environment. Every build runs in its own
process (PYTHONPATH puts its `llama_cpp` first) with one single-thread engine, as each actor of `sira enrich` has:

- prompt tok/s: llama.cpp evaluating each document's whole prompt from an empty KV cache (no prefix reuse);
- docs/s and generated tok/s: the job's own decoding (`LocalLLMActor.generate`) over the same prompts, the
  worked examples' KV cache reused from one document to the next as in the job.

Prompts: the first `--docs` scifact documents under the fact_check template, as bench/enrich_speed.py renders
them. Builds run in turns (A, B, A, B, ...; `--rounds`), the faster round of each counts, so drifting load on a
shared machine does not favour one build. Also reported: on how many documents each build's output equals the
first build's (kernels differ in rounding, so decoding with the same seed may take another path).
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
import zipfile
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def worker(prompts: list[str]) -> dict:
    """In the build's process: one 1-thread engine over `prompts`."""
    import llama_cpp

    from sira.pipelines.enrichment.backend_config import BackendConfig
    from sira.pipelines.enrichment.local_llm import LocalLLMActor, completion_text

    actor = LocalLLMActor(BackendConfig(backend="local").model_dump_json(), threads=1)
    llm = actor.llm
    evaluated, started = 0, time.perf_counter()
    for prompt in prompts:
        tokens = llm.tokenize(completion_text(prompt, fewshot=True).encode())
        llm.reset()
        llm.eval(tokens)
        evaluated += len(tokens)
    prompt_seconds = time.perf_counter() - started
    llm.reset()
    started = time.perf_counter()
    rows = [actor.generate(p) for p in prompts]
    seconds = time.perf_counter() - started
    output_tokens = sum(r["output_tokens"] for r in rows)
    return {"system_info": llama_cpp.llama_print_system_info().decode().strip(), "llama_cpp": llama_cpp.__file__,
            "prompt_tokens": evaluated, "prompt_tokens_per_second": evaluated / prompt_seconds,
            "documents": len(prompts), "seconds": seconds, "docs_per_second": len(prompts) / seconds,
            "output_tokens": output_tokens, "output_tokens_per_second": output_tokens / seconds,
            "errors": sum(r["error"] is not None for r in rows), "outputs": [r["raw_output"] for r in rows]}


def package_dir(name: str, spec: str, tmp: Path) -> str | None:
    """The folder to put first on PYTHONPATH for a build (None: this environment's own llama_cpp)."""
    if spec == "installed":
        return None
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".whl":
        target = tmp / name  # wheels of two builds share one file name
        with zipfile.ZipFile(path) as wheel:
            wheel.extractall(target)
        return str(target)
    if (path / "llama_cpp").is_dir():
        return str(path)
    raise SystemExit(f"--build {spec}: neither a wheel nor a folder holding a llama_cpp package")


def run_build(folder: str | None, prompts_file: Path) -> dict:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE",
           "PYTHONPATH": os.pathsep.join(p for p in (folder, str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, __file__, "--worker", str(prompts_file)], env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"build at {folder or 'installed'} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", action="append", default=[], metavar="NAME=WHEEL_OR_DIR")
    parser.add_argument("--docs", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output-json", default=str(REPO_ROOT / "bench/results/llama_build_speed.json"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(Path(args.worker).read_text()))))
        return 0
    builds = dict(b.split("=", 1) for b in args.build)
    if len(builds) < 2 or len(builds) < len(args.build) or any(not v for v in builds.values()):
        parser.error("give at least two --build NAME=WHEEL_OR_DIR, each NAME once")

    sys.path.insert(0, str(REPO_ROOT))
    from bench.enrich_speed import first_docs, job_prompts

    prompts = job_prompts(first_docs(args.docs))
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="sira-llama-builds-") as tmp:
        prompts_file = Path(tmp) / "prompts.json"
        prompts_file.write_text(json.dumps(prompts))
        folders = {name: package_dir(name, spec, Path(tmp)) for name, spec in builds.items()}
        for round_no in range(args.rounds):
            for name, folder in folders.items():
                print(f"round {round_no + 1}: {name} ...", file=sys.stderr, flush=True)
                run = run_build(folder, prompts_file)
                best = results.get(name)
                if best is None or run["docs_per_second"] > best["docs_per_second"]:
                    results[name] = {**run, "prompt_tokens_per_second": max(
                        run["prompt_tokens_per_second"], (best or run)["prompt_tokens_per_second"])}
    first = next(iter(results))
    reference = results[first]
    print(f"{'build':10} {'prompt tok/s':>12} {'docs/s':>7} {'gen tok/s':>9} {'same output as ' + first:>24}")
    for name, r in results.items():
        r["same_output_as_first"] = sum(a == b for a, b in zip(r["outputs"], reference["outputs"]))
        r["ratio_to_first"] = {k: r[k] / reference[k] for k in
                               ("prompt_tokens_per_second", "docs_per_second", "output_tokens_per_second")}
        print(f"{name:10} {r['prompt_tokens_per_second']:>12.1f} {r['docs_per_second']:>7.3f} "
              f"{r['output_tokens_per_second']:>9.1f} {r['same_output_as_first']:>20}/{r['documents']}")
    report = {"created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": "python bench/llama_build_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average": os.getloadavg()},
              "builds": builds, "results": results}
    Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output_json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output_json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
