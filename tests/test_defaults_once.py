"""Each shared default is written once: tau, w, k, the batch sizes, the serve limits, the preset and the variants are
constants (sira.core.defaults, sira.core.variants), and every config field, function parameter and option that
takes one of them names the constant instead of restating its value. Read from the source (ast); the CLI's options
are generated from the configs (sira.jobs.options), so they cannot restate one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sira_core", "pipelines", "jobs")
# Names whose default, wherever one is given, must be a named constant (None and booleans say "unset" or "off").
SHARED = {"tau", "w", "k", "batch_size", "query_batch", "max_query_chars", "max_k", "max_concurrent", "preset",
          "variant", "variants", "shards", "depth", "spark_master", "poll_s", "base_url"}


def literal_defaults(path: Path) -> list[tuple[str, int, object]]:
    """(name, line, value) of every literal default in a module: parameters, typer.Option(...) and pydantic fields."""
    tree, found = ast.parse(path.read_text(encoding="utf-8")), []

    def literal(node):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
                "Field", "Option"):
            node = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "default"), None)
        if isinstance(node, ast.Constant) and node.value is not None and not isinstance(node.value, bool) \
                and node.value is not ...:
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts and all(isinstance(e, ast.Constant) for e in node.elts):
            return [e.value for e in node.elts]
        return None

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
            found += [(a.arg, d.lineno, literal(d)) for a, d in pairs]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            found.append((node.target.id, node.lineno, literal(node.value)))
    return [(name, line, value) for name, line, value in found if value is not None]


def test_shared_defaults_are_named_constants_not_restated_values():
    restated = [f"{path.relative_to(ROOT)}:{line}: {name} = {value!r}"
                for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
                for name, line, value in literal_defaults(path) if name in SHARED]
    assert restated == []


@pytest.mark.parametrize("snippet, expected", [
    ("def f(tau=0.05): pass", [("tau", 1, 0.05)]),
    ("class C:\n    k: int = Field(1000, ge=1)", [("k", 2, 1000)]),
    ("def f(k: int = typer.Option(10, '-k')): pass", [("k", 1, 10)]),
    ("def f(tau=DEFAULT_TAU, w=None, full=False): pass", []),
])
def test_the_scan_sees_each_way_a_default_is_written(tmp_path, snippet, expected):
    module = tmp_path / "m.py"
    module.write_text(snippet)
    assert literal_defaults(module) == expected
