"""The package's shape: one `sira` namespace, layers that import only downwards (core <- pipelines <- jobs), no
import cycle, and an installed wheel that works beside another project's `pipelines` package."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"sira_core": "sira.core", "pipelines": "sira.pipelines", "jobs": "sira.jobs"}
LAYER = {"sira.core": 0, "sira.pipelines": 1, "sira.jobs": 2}


def modules() -> dict[str, Path]:
    """Every module of the distribution by its installed name."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = [package, *path.relative_to(REPO / folder).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_file_imports_the_bare_folder_names():
    # From the repository root both spellings would import, as two copies of every module.
    sources = [p for top in ("sira", *FOLDERS, "tests", "bench", "docs", "infra") for p in (REPO / top).rglob("*.py")]
    bare = [f"{p.relative_to(REPO)}: {name}" for p in sources for name in imported_names(p)
            if name.split(".")[0] in FOLDERS]
    assert bare == []


def test_layers_import_only_downwards_and_nothing_cycles():
    mods = modules()
    graph = {name: {dep for dep in imported_names(path) if dep in mods and dep != name} for name, path in mods.items()}
    layer = {name: LAYER[".".join(name.split(".")[:2])] for name in mods}
    upward = [f"{a} -> {b}" for a, deps in graph.items() for b in deps if layer[b] > layer[a]]
    assert upward == []
    # A cycle is a strongly connected set of more than one module (Tarjan's algorithm).
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
                on_stack.discard(w)
            on_stack.discard(v)
            if component:
                cycles.append(sorted([v, *component]))

    for name in graph:
        if name not in index:
            visit(name)
    assert cycles == []


@pytest.mark.skipif(shutil.which("uv", path=str(Path(sys.executable).parent)) is None and shutil.which("uv") is None,
                    reason="uv is not installed")
def test_the_wheel_installs_beside_another_pipelines_package(tmp_path):
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    # Built from a copy, so that the build leaves nothing in the checkout.
    source = tmp_path / "source"
    for name in ("sira", *FOLDERS):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run([uv, "build", "--wheel", "--out-dir", str(tmp_path / "dist"), str(source)], check=True,
                   capture_output=True, text=True)
    wheel = next((tmp_path / "dist").glob("sira-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([uv, "pip", "install", "--python", str(python), "--no-deps", str(wheel)], check=True,
                   capture_output=True, text=True)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # Another project's top-level `pipelines` package, installed in the same environment.
    (site / "pipelines").mkdir()
    (site / "pipelines" / "__init__.py").write_text("OWNER = 'another project'\n")
    # sira's dependencies come from the test environment, after the fresh venv's own packages.
    deps = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (site / "zz_test_dependencies.pth").write_text(deps + "\n")

    def run(*args: str) -> str:
        return subprocess.run([*args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    assert "Usage: sira" in run(str(venv / "bin" / "sira"), "--help")
    check = ("import pipelines, sira.core, sira.pipelines.serving.serve, sira.jobs.cli; "
             "print(pipelines.OWNER); print(sira.core.__file__); print(sira.core.get_preset('sira').name)")
    owner, core_file, preset = run(str(python), "-c", check).splitlines()
    assert owner == "another project" and core_file.startswith(str(site)) and preset == "sira"
    # Package data travels in the wheel: stopwords, prompts and the web page.
    assert (site / "sira" / "core" / "resources").is_dir()
    assert (site / "sira" / "pipelines" / "serving" / "web" / "index.html").exists()


def test_serving_loads_no_enrichment_dataflow():
    """`sira serve` answers queries: the Ray Data enrichment job's code (and Ray Data) is not its to load."""
    check = ("import sys, sira.pipelines.serving.serve; print(sorted(m for m in sys.modules if m.startswith(("
             "'sira.pipelines.enrichment.ray_enrich', 'sira.pipelines.enrichment.query_expansion', 'ray.data'))))")
    loaded = subprocess.run([sys.executable, "-c", check], cwd=REPO, check=True, capture_output=True, text=True)
    assert loaded.stdout.strip() == "[]"


def test_a_backend_config_is_read_without_the_llm_stages():
    """Job configs name a proposer (BackendConfig); the Ray Data LLM stages are loaded by the jobs that run them."""
    check = ("import sys, sira.jobs.query, sira.jobs.serve, sira.jobs.sweep, sira.pipelines.index.freshness; "
             "print('sira.pipelines.enrichment.llm_backends' in sys.modules)")
    loaded = subprocess.run([sys.executable, "-c", check], cwd=REPO, check=True, capture_output=True, text=True)
    assert loaded.stdout.strip() == "False"


# Entry points a reader follows first: the CLI's search, query and eval, the jobs they call and the server's search.
# cli `command`: what every plain job's command runs (`sira query` among them).
ENTRY_POINTS = {"jobs/cli.py": ("search", "command", "eval_"), "jobs/query.py": ("run",), "jobs/eval.py": ("run",),
                "pipelines/serving/serve.py": ("_search",)}


def test_files_and_functions_stay_short_enough_to_hold_in_mind():
    """No module over 600 lines, no function over 80 (numba kernels too), no entry point's body over 25, and the
    jobs (the CLI and the thin runners) under 1,200 lines together."""
    long_files, long_functions, long_entries, job_lines = [], [], [], 0
    for path in modules().values():
        source = path.read_text("utf-8")
        rel = path.relative_to(REPO).as_posix()
        job_lines += source.count("\n") if rel.startswith("jobs/") else 0
        if source.count("\n") > 600:
            long_files.append(rel)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > 80:
                    long_functions.append(f"{rel}:{node.name}")
                if node.name in ENTRY_POINTS.get(rel, ()):
                    body = node.body[1:] if isinstance(node.body[0], ast.Expr) and isinstance(
                        node.body[0].value, ast.Constant) else node.body
                    if body[-1].end_lineno - body[0].lineno + 1 > 25:
                        long_entries.append(f"{rel}:{node.name}")
    assert (long_files, long_functions, long_entries) == ([], [], [])
    assert job_lines < 1200, f"jobs/ holds {job_lines} lines"
