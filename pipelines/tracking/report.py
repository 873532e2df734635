"""Reports of evaluated runs: the comparison table of one `sira run`, the cross-dataset report with its plots (read
from MLflow, beside the published references; ReportConfig is `sira report`'s), and the plot of a paired comparison (`sira
compare`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from sira.pipelines.tracking.tracking import TrackingConfig
from sira.core.variants import BASELINE_VARIANT, RERANK_VARIANT, VARIANTS

# Published nDCG@10 on BEIR test (the brief and ../shared/SIRA_REFERENCE.md); references, not our measurements.
REFERENCES = {
    "Pyserini BM25 flat": {"scifact": 0.6789, "nfcorpus": 0.3218, "arguana": 0.3970},
    "Pyserini BM25 multifield": {"scifact": 0.6647, "nfcorpus": 0.3254, "arguana": 0.4142},
    "SIRA paper BM25": {"scifact": 0.6791, "arguana": 0.4874},
}
PAPER_AVERAGES = {"BM25": 0.4247, "SPLADE": 0.5223, "E5": 0.5434, "SIRA": 0.5723}  # over the paper's 10 datasets


class ReportConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    output_dir: str = Field("reports", description="report.md and the PNG plots go here")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    datasets: list[str] | None = Field(None, description="default: every dataset with a `sira run`")


def collect(tracking: TrackingConfig, datasets: list[str] | None = None) -> dict[str, dict]:
    """dataset -> {command, run_id, variants: {variant: {metrics, run_id}}} from the newest `sira run` each."""
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(tracking.resolved_uri())
    client = MlflowClient()
    exp = client.get_experiment_by_name(tracking.experiment)
    if exp is None:
        raise LookupError(f"no MLflow experiment {tracking.experiment!r} at {tracking.resolved_uri()}; "
                          "run `sira run` first")
    parents = client.search_runs([exp.experiment_id], "tags.`sira.job` = 'run' and attributes.status = 'FINISHED'",
                                 order_by=["attributes.start_time DESC"])
    out: dict[str, dict] = {}
    for parent in parents:
        dataset = parent.data.tags.get("sira.dataset")
        if dataset in out or (datasets and dataset not in datasets):
            continue
        children = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
        variants = {c.data.tags["sira.variant"]: {"metrics": {k.replace("_at_", "@"): v for k, v in c.data.metrics.items()
                                                              if "_at_" in k},
                                                  "run_id": c.info.run_id}
                    for c in children if "sira.variant" in c.data.tags}
        out[dataset] = {"command": parent.data.tags.get("sira.command", ""), "run_id": parent.info.run_id,
                        "split": parent.data.tags.get("sira.split", "test"), "variants": variants}
    if not out:
        raise LookupError("no finished `sira run` in MLflow; run `sira run --dataset beir:NAME` first")
    return out


def render(results: dict[str, dict], output_dir: str) -> dict:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# SIRA report", "",
             "nDCG@10 on each dataset's split, from MLflow. Every row of ours names the command and the MLflow run "
             "that produced it; reference rows are published numbers.", ""]
    plots = []
    for dataset, r in sorted(results.items()):
        variants = [v for v in VARIANTS if v in r["variants"]]
        lines += [f"## {dataset} ({r['split']})", "", f"Command: `{r['command']}` (MLflow parent run `{r['run_id']}`)", "",
                  "| system | nDCG@10 | Recall@10 | Recall@100 | MLflow run |", "|---|---|---|---|---|"]
        for v in variants:
            m = r["variants"][v]["metrics"]
            lines.append(f"| ours: {v} | {m.get('ndcg@10', float('nan')):.4f} | {m.get('recall@10', float('nan')):.4f} | "
                         f"{m.get('recall@100', float('nan')):.4f} | `{r['variants'][v]['run_id']}` |")
        refs = {name: vals[dataset] for name, vals in REFERENCES.items() if dataset in vals}
        lines += [f"| {name} (published) | {value:.4f} | | | |" for name, value in refs.items()] + [""]
        names = [f"ours: {v}" for v in variants] + list(refs)
        values = [r["variants"][v]["metrics"].get("ndcg@10", 0.0) for v in variants] + list(refs.values())
        fig, ax = plt.subplots(figsize=(1.2 * len(names) + 2, 3.6))
        bars = ax.bar(range(len(names)), values, color=["tab:blue"] * len(variants) + ["tab:gray"] * len(refs))
        ax.bar_label(bars, fmt="%.3f", fontsize=8)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("nDCG@10")
        ax.set_title(f"{dataset} ({r['split']})")
        ax.set_ylim(0, max(values) * 1.15 if values else 1)
        fig.tight_layout()
        png = out / f"{dataset}.png"
        fig.savefig(png, dpi=120)
        plt.close(fig)
        plots.append(str(png))
        lines += [f"![{dataset}]({png.name})", ""]
    lines += ["## Paper averages (10 BEIR datasets, nDCG@10; published)", "",
              "| system | nDCG@10 |", "|---|---|"] + [f"| {k} | {v:.4f} |" for k, v in PAPER_AVERAGES.items()] + [""]
    report = out / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return {"report": str(report), "plots": plots, "datasets": sorted(results)}


def plot_paired_comparison(summary: dict, path: str | Path) -> str:
    """One PNG for `sira compare`: each query's difference (run minus base), sorted, wins above the line and losses
    below, so a mean difference shows whether it comes from many queries or a few."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_query = summary["per_query"]
    deltas = sorted((s["run"] - s["base"] for s in per_query.values()), reverse=True)
    colours = ["tab:green" if d > 1e-9 else "tab:red" if d < -1e-9 else "tab:gray" for d in deltas]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.bar(range(len(deltas)), deltas, width=1.0, color=colours)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xlim(-0.5, len(deltas) - 0.5)
    ax.set_xlabel(f"queries, sorted by difference ({summary['queries']})")
    ax.set_ylabel(f"Δ {summary['metric']}")
    ax.set_title(f"{summary['dataset']} / {summary['split']}: {Path(summary['run_file']).name} − "
                 f"{Path(summary['base_run']).name}\n{summary['metric']} {summary['run']:.4f} vs {summary['base']:.4f}, "
                 f"Δ {summary['delta']:+.4f}, p {summary['p_value']:.4f}, wins / losses / ties "
                 f"{summary['wins']} / {summary['losses']} / {summary['ties']}", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def comparison_markdown(dataset: str, split: str, results: dict[str, dict]) -> str:
    metrics = ("ndcg@10", "recall@10", "recall@100")
    base = results.get(BASELINE_VARIANT, {}).get("metrics", {})
    lines = [f"# {dataset} / {split}", "", "| variant | " + " | ".join(metrics) + " | Δ nDCG@10 vs bm25 | MLflow run |",
             "|---|" + "---|" * (len(metrics) + 2)]
    for variant, r in results.items():
        m = r["metrics"]
        delta = f"{m['ndcg@10'] - base['ndcg@10']:+.4f}" if base and variant != BASELINE_VARIANT else ""
        lines.append(f"| {variant_label(variant, r)} | " + " | ".join(f"{m[k]:.4f}" for k in metrics)
                     + f" | {delta} | {r.get('mlflow_run_id') or ''} |")
    return "\n".join(lines) + "\n"


def variant_label(variant: str, summary: dict) -> str:
    """The variant's name, marked when it is not a single BM25 call (an LLM reranked it)."""
    if variant != RERANK_VARIANT:
        return variant
    return f"{variant} (not single-call: LLM rerank of the top {summary['rerank']['depth']})"
