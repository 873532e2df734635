"""Single-step jobs stand alone; only the composite jobs compose them (ARCHITECTURE.md, Layout). Read from the
source's imports (ast), wherever in a module they are."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

JOBS = Path(__file__).resolve().parents[1] / "jobs"
SINGLE_STEP = {"ingest", "index", "enrich", "eval", "query", "serve", "report"}
COMPOSITE = {"run", "nightly", "sweep"}
ENTRY = {"cli", "options"}  # the `sira` command dispatches to every job; options: its shared options


def jobs_imported(name: str) -> set[str]:
    """The modules of `sira.jobs` that jobs/<name>.py imports."""
    found = set()
    for node in ast.walk(ast.parse((JOBS / f"{name}.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "sira.jobs":
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sira.jobs."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[2] for alias in node.names if alias.name.startswith("sira.jobs.")}
    return found


def test_every_module_of_jobs_has_a_role():
    assert {p.stem for p in JOBS.glob("*.py")} - {"__init__"} == SINGLE_STEP | COMPOSITE | ENTRY


@pytest.mark.parametrize("name", sorted(SINGLE_STEP))
def test_a_single_step_job_imports_no_other_job(name):
    assert jobs_imported(name) == set()


@pytest.mark.parametrize("name", sorted(COMPOSITE))
def test_a_composite_job_composes_single_step_jobs_only(name):
    imported = jobs_imported(name) - {"options"}  # `sira run` names its options to write its own command line
    assert imported and imported <= SINGLE_STEP
