"""infra/: every definition parses, and every `sira` command it runs exists and accepts what it is given.

No cluster, JVM or Ray instance is started: the files are parsed (YAML, JSON, `bash -n`, Python AST), their
`sira ...` command lines are parsed by the CLI's own click parser, and versions, paths and module names are
checked against what is installed and what is in the repository.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re
import shlex
import subprocess
import typing
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import pytest
import typer
import yaml

from sira.jobs.cli import app

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"
FILES = sorted(p for p in INFRA.rglob("*") if p.is_file() and "__pycache__" not in p.parts)

SIRA = re.compile(r"(?<![\w.-])sira[ \t]+([a-z][a-z-]*)(.*)")   # `sira <command> <arguments>`
ENTRY = re.compile(r"sira_index_main\.py[\"']?(.*)")           # the spark-submit application = `sira index`
SHELL_END = re.compile(r"&&|\|\||[;|<>]")                        # where a command's arguments end
OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
CRON_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=")


@dataclass(frozen=True)
class Invocation:
    file: str
    command: str
    rest: str          # the arguments as written
    executable: bool   # False for documentation (Markdown), whose examples may elide arguments

    def args(self) -> list[str]:
        # "$@" forwards the caller's arguments: nothing to check here.
        return [a for a in shlex.split(self.rest) if a not in ("$@", "$*")]


def rel(path: Path) -> str:
    return path.relative_to(INFRA).as_posix()


def shell_lines(text: str) -> list[str]:
    """Logical lines (backslash continuations joined) without comment lines."""
    return [line for line in text.replace("\\\n", " ").splitlines() if not line.lstrip().startswith("#")]


def yaml_strings(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for v in node.values() for s in yaml_strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in yaml_strings(v)]
    return []


def python_strings(source: str) -> list[str]:
    """String constants of a module, docstrings left out (they are prose, not commands)."""
    tree = ast.parse(source)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def markdown_code(text: str) -> list[str]:
    blocks = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return [line for block in blocks for line in shell_lines(block)] + inline


def command_texts(path: Path) -> tuple[list[str], bool]:
    """The texts of a file that hold command lines, and whether they are meant to run as written."""
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        return [line for doc in yaml.safe_load_all(text) for s in yaml_strings(doc) for line in s.splitlines()], True
    if path.suffix == ".json":
        return [], True  # its one command is built from spark_python_task below
    if path.suffix == ".py":
        return [line for s in python_strings(text) for line in s.splitlines()], True
    if path.suffix == ".md":
        return markdown_code(text), False
    return shell_lines(text), True


def databricks_invocations(path: Path) -> list[Invocation]:
    job = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for task in job["tasks"]:
        spt = task.get("spark_python_task")
        if spt and spt["python_file"].endswith("sira_index_main.py"):
            out.append(Invocation(rel(path), "index", shlex.join(spt.get("parameters", [])), True))
    return out


@lru_cache
def invocations() -> tuple[Invocation, ...]:
    found = []
    for path in FILES:
        if path.suffix == ".json":
            found += databricks_invocations(path)
        texts, executable = command_texts(path)
        for text in texts:
            for segment in SHELL_END.split(text):
                if m := SIRA.search(segment):
                    found.append(Invocation(rel(path), m.group(1), m.group(2), executable))
                elif m := ENTRY.search(segment):
                    found.append(Invocation(rel(path), "index", m.group(1), executable))
    return tuple(found)


@lru_cache
def cli():
    """The click group behind the typer app (typer vendors its own click)."""
    return typer.main.get_command(app)


def options_of(command) -> set[str]:
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}


def pyspark_jars() -> Path:
    spec = importlib.util.find_spec("pyspark")
    return Path(next(iter(spec.submodule_search_locations))) / "jars"


def resolves(dotted: str) -> bool:
    """A module, or an attribute of one (`sira.pipelines.storage.spark_session.get_spark`)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        try:
            found = importlib.util.find_spec(".".join(parts[:n])) is not None
        except ModuleNotFoundError:
            found = False
        if found:
            obj = importlib.import_module(".".join(parts[:n]))
            return all((obj := getattr(obj, attr, None)) is not None for attr in parts[n:])
    return False


def load_yaml(name: str):
    return yaml.safe_load((INFRA / name).read_text(encoding="utf-8"))


def crontab_jobs() -> list[tuple[list[str], str]]:
    """(five schedule fields, command) of every job line of the crontab."""
    jobs = []
    for line in (INFRA / "schedule" / "crontab").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#") and not CRON_ENV.match(line):
            fields = line.split(None, 5)
            jobs.append((fields[:5], fields[5]))
    return jobs


# ---------------------------------------------------------------- the files parse --------------------------------


def test_infra_holds_the_definitions_the_issue_asks_for():
    names = {rel(p) for p in FILES}
    for required in ("README.md", "ray/rayjob-enrich.yaml", "ray/cluster.yaml", "spark/spark-submit-index.sh",
                     "spark/sira_index_main.py", "databricks/index-job.json", "schedule/crontab",
                     "schedule/sira_nightly_dag.py", "warehouse/s3.env.example", "warehouse/spark-s3a.conf"):
        assert required in names


@pytest.mark.parametrize("path", [p for p in FILES if p.suffix in (".yaml", ".yml")], ids=rel)
def test_yaml_parses(path):
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    assert docs and all(isinstance(d, dict) for d in docs)


@pytest.mark.parametrize("path", [p for p in FILES if p.suffix == ".json"], ids=rel)
def test_json_parses(path):
    assert isinstance(json.loads(path.read_text(encoding="utf-8")), dict)


@pytest.mark.parametrize("path", [p for p in FILES if p.suffix == ".sh"], ids=rel)
def test_shell_scripts_pass_bash_n_and_are_executable(path):
    subprocess.run(["bash", "-n", str(path)], check=True)
    assert path.stat().st_mode & 0o111, f"{rel(path)} is not executable"


@pytest.mark.parametrize("path", [p for p in FILES if p.suffix == ".py"], ids=rel)
def test_python_files_parse(path):
    ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def test_every_command_line_passes_bash_n():
    lines = [(rel(p), t) for p in FILES if p.suffix in (".yaml", ".yml", ".py") or p.name == "crontab"
             for t in command_texts(p)[0] if SIRA.search(t)]
    lines += [("schedule/crontab", cmd) for _, cmd in crontab_jobs()]
    assert lines
    for where, line in lines:
        result = subprocess.run(["bash", "-n", "-c", line], capture_output=True, text=True)
        assert result.returncode == 0, f"{where}: {line!r}: {result.stderr}"


# ---------------------------------------------------------------- the commands exist --------------------------------


def test_the_definitions_run_the_expected_commands():
    found = {(i.file, i.command) for i in invocations()}
    for expected in (("ray/rayjob-enrich.yaml", "enrich"), ("spark/spark-submit-index.sh", "index"),
                     ("databricks/index-job.json", "index"), ("schedule/crontab", "nightly"),
                     ("schedule/sira_nightly_dag.py", "nightly")):
        assert expected in found, f"{expected} not among {sorted(found)}"


def test_every_sira_invocation_names_a_command_and_its_options():
    commands = cli().commands
    problems = []
    for inv in invocations():
        command = commands.get(inv.command)
        if command is None:
            problems.append(f"{inv.file}: `sira {inv.command}` is not a command ({', '.join(sorted(commands))})")
            continue
        unknown = {o.split("=")[0] for o in OPTION.findall(inv.rest)} - options_of(command)
        if unknown:
            problems.append(f"{inv.file}: `sira {inv.command}` has no option {sorted(unknown)}")
    assert not problems, "\n".join(problems)


def test_executable_invocations_parse_with_the_cli(monkeypatch):
    """click parses each command line as `sira` would (types, required options), without running the job."""
    monkeypatch.delenv("SIRA_WAREHOUSE", raising=False)  # required options must be on the line itself
    executable = [i for i in invocations() if i.executable]
    assert len(executable) >= 5
    for inv in executable:
        command = cli().commands[inv.command]
        try:
            command.make_context(f"sira {inv.command}", inv.args())
        except Exception as exc:  # typer's click raises UsageError / BadParameter / MissingParameter
            message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            pytest.fail(f"{inv.file}: `sira {inv.command} {inv.rest.strip()}`: {message}")


def test_backend_and_preset_values_exist():
    from sira.pipelines.enrichment.backend_config import BackendConfig
    from sira.core.presets import PRESETS

    backends = set(typing.get_args(BackendConfig.model_fields["backend"].annotation))
    for inv in invocations():
        args = inv.args() if inv.executable else inv.rest.split()
        for flag, allowed in (("--backend", backends), ("--preset", set(PRESETS))):
            for i, a in enumerate(args[:-1]):
                if a == flag and not args[i + 1].startswith("$"):
                    assert args[i + 1] in allowed, f"{inv.file}: {flag} {args[i + 1]} (known: {sorted(allowed)})"


def test_spark_entry_script_runs_the_index_command_on_the_submitted_master():
    spec = importlib.util.spec_from_file_location("sira_index_main", INFRA / "spark" / "sira_index_main.py")
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)  # imports nothing heavy at module level: pyspark only inside main()

    argv = entry.index_argv(["--warehouse", "s3a://b/w", "--shards", "8"], "spark://m:7077")
    assert argv[:3] == ["index", "--spark-master", "spark://m:7077"]
    ctx = cli().commands["index"].make_context("sira index", argv[1:])
    assert ctx.params["spark_master"] == "spark://m:7077" and ctx.params["shards"] == 8
    explicit = entry.index_argv(["--spark-master=local[2]", "--warehouse", "w"], "spark://m:7077")
    assert cli().commands["index"].make_context("sira index", explicit[1:]).params["spark_master"] == "local[2]"


# ---------------------------------------------------------------- versions and names agree -------------------------


def test_delta_coordinate_and_confs_are_the_ones_get_spark_uses():
    from delta import configure_spark_with_delta_pip
    from pyspark.sql import SparkSession

    from sira.pipelines.storage.spark_session import DEFAULT_CONF

    expected = configure_spark_with_delta_pip(SparkSession.builder)._options["spark.jars.packages"]
    assert expected == f"io.delta:delta-spark_{'.'.join(metadata.version('pyspark').split('.')[:2])}_2.13:" \
                       f"{metadata.version('delta-spark')}"
    used = {m for p in FILES for m in re.findall(r"io\.delta:delta-spark[\w.]*:[\w.]+", p.read_text(encoding="utf-8"))}
    assert used == {expected}
    script = (INFRA / "spark" / "spark-submit-index.sh").read_text(encoding="utf-8")
    for key in ("spark.sql.extensions", "spark.sql.catalog.spark_catalog"):
        assert f"--conf {key}={DEFAULT_CONF[key]}" in script


def test_hadoop_aws_matches_the_hadoop_pyspark_ships():
    shipped = {m.group(1) for j in pyspark_jars().glob("hadoop-client-api-*.jar")
               if (m := re.fullmatch(r"hadoop-client-api-([\d.]+)\.jar", j.name))}
    assert len(shipped) == 1
    used = {m for p in FILES
            for m in re.findall(r"org\.apache\.hadoop:hadoop-aws:([\w.]+)", p.read_text(encoding="utf-8"))}
    assert used == shipped


def test_ray_versions_match_the_installed_ray():
    ray = metadata.version("ray")
    assert load_yaml("ray/rayjob-enrich.yaml")["spec"]["rayClusterSpec"]["rayVersion"] == ray
    assert f'"ray[default]=={ray}"' in (INFRA / "ray" / "cluster.yaml").read_text(encoding="utf-8")
    assert f'"ray[default]=={ray}"' in (INFRA / "schedule" / "sira_nightly_dag.py").read_text(encoding="utf-8")


def test_rayjob_runs_one_vllm_engine_per_gpu():
    spec = load_yaml("ray/rayjob-enrich.yaml")["spec"]
    gpus = 0
    for group in spec["rayClusterSpec"]["workerGroupSpecs"]:
        for container in group["template"]["spec"]["containers"]:
            per_pod = int(container["resources"]["limits"].get("nvidia.com/gpu", 0))
            assert int(container["resources"]["requests"].get("nvidia.com/gpu", 0)) == per_pod
            gpus += per_pod * group["replicas"]
    assert gpus > 0
    [enrich] = [i for i in invocations() if i.file == "ray/rayjob-enrich.yaml"]
    params = cli().commands["enrich"].make_context("sira enrich", enrich.args()).params
    assert params["backend"] == "vllm" and params["model"] and params["ray_address"] == "auto"
    assert params["concurrency"] == gpus


def test_ray_cluster_yaml_follows_rays_schema():
    jsonschema = pytest.importorskip("jsonschema")
    spec = importlib.util.find_spec("ray")
    schema = json.loads((Path(next(iter(spec.submodule_search_locations))) / "autoscaler" / "ray-schema.json")
                        .read_text(encoding="utf-8"))
    config = load_yaml("ray/cluster.yaml")
    jsonschema.validate(config, schema)
    for local in config["file_mounts"].values():
        assert local == "./dist" or (ROOT / local).exists(), local   # dist/ is built by `uv build` first


def test_paths_and_modules_named_in_infra_exist():
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        for named in re.findall(r"(?<![\w/~.-])infra/[\w./-]*\w", text):
            assert (ROOT / named).exists(), f"{rel(path)} names {named}"
        for module in re.findall(r"\b(sira\.(?:core|pipelines|jobs)(?:\.[a-z_]+)+)", text):
            assert resolves(module), f"{rel(path)} names {module}"


def test_readme_describes_every_file():
    readme = (INFRA / "README.md").read_text(encoding="utf-8")
    for path in FILES:
        if path.name != "README.md":
            assert rel(path) in readme, f"infra/README.md does not mention {rel(path)}"
    for named in re.findall(r"`((?:ray|spark|databricks|schedule|warehouse)/[\w.-]+)`", readme):
        assert (INFRA / named).exists(), f"infra/README.md names {named}"


# ---------------------------------------------------------------- the schedule --------------------------------------


def test_crontab_runs_the_nightly_once_at_a_time():
    jobs = crontab_jobs()
    assert jobs
    for fields, command in jobs:
        assert len(fields) == 5 and all(re.fullmatch(r"[\d*/,-]+", f) for f in fields), fields
        assert "%" not in command, "cron turns % into a newline"
        assert re.search(r"flock -n \S+ sira nightly ", command)


def dag_call(tree: ast.Module, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == name]


def test_dag_chains_the_nightly_and_a_serve_health_check():
    source = (INFRA / "schedule" / "sira_nightly_dag.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    [dag] = dag_call(tree, "DAG")
    kw = {k.arg: k.value for k in dag.keywords}
    assert ast.literal_eval(kw["max_active_runs"]) == 1 and ast.literal_eval(kw["catchup"]) is False
    [(cron_fields, cron_command)] = crontab_jobs()
    assert ast.literal_eval(kw["schedule"]) == " ".join(cron_fields)

    tasks = {ast.literal_eval(next(k.value for k in c.keywords if k.arg == "task_id")): c
             for c in dag_call(tree, "BashOperator")}
    assert set(tasks) == {"sira_nightly", "serve_health"}
    chains = [n for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.RShift)]
    assert any(getattr(c.left, "id", None) == "nightly" and getattr(c.right, "id", None) == "serve_health"
               for c in chains)

    strings = python_strings(source)
    lock = re.search(r"flock -n (\S+) sira nightly", cron_command).group(1)
    assert any(f"flock -n {lock} sira nightly" in s for s in strings), "DAG and crontab must share the lock"
    serve_routes = (ROOT / "pipelines" / "serving" / "serve.py").read_text(encoding="utf-8")
    assert 'add_get("/health"' in serve_routes and any("/health" in s and "curl -f" in s for s in strings)
