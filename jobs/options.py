"""The `sira` command line's options, generated from the job configs: a field's default, bounds and help live in
its pydantic config, and `config_options` turns the fields a command takes into typer options. Also the helpers
that build what no single field does (a reranker, the engine logs, the JSON summary)."""

from __future__ import annotations

import functools
import inspect
import json
import types
import typing
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Sequence

import typer
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from sira.pipelines.tracking.console import engine_log_path, engine_logs
from sira.core.defaults import default_warehouse

# Option names that are not --FIELD-NAME (a field path: "backend.model" is BackendConfig's model inside a job's).
OPTION_NAMES: dict[str, tuple[str, ...]] = {
    "warehouse": ("--warehouse", "-w"),
    "dataset": ("--dataset", "-d"),
    "k": ("-k",),
    "w": ("--expansion-weight",),
    "grid": ("--param",),
    "retry_errors": ("--retry-errors/--keep-errors",),
    "tracking.enabled": ("--tracking/--no-tracking",),
    "backend.structured_output": ("--structured-output/--free-output",),
    "backend.engine_kwargs": ("--engine-arg",),
    "backend.sampling_kwargs": ("--sampling-arg",),
    "backend.encoder.proposals": ("--proposals",),
    "backend.encoder.entries": ("--entries",),
    "backend.encoder.model": ("--encoder",),
    "doc_backend.backend": ("--doc-backend",),
    "rerank.backend.backend": ("--rerank-backend",),
    "rerank.backend": ("--rerank-backend",),
    "rerank.backend.model": ("--rerank-model",),
    "rerank.depth": ("--rerank-depth",),
}
# Help for a field whose own description is another's (the judge's backend is a BackendConfig, whose says proposer).
OPTION_HELP = {"rerank.backend.backend": "sira+rerank: the LLM judge, openai | local",
               "rerank.backend.model": "sira+rerank: the judge's model (default: --model when --rerank-backend is "
                                       "--backend; local: the packaged one)"}
ENV_VARS = {"warehouse": "SIRA_WAREHOUSE"}
# The sira+rerank variant's judge (no --rerank-backend: no reranker).
RERANK, RERANK_DEFAULTS = ("rerank.backend.backend", "rerank.backend.model", "rerank.depth"), \
    {"rerank.backend.backend": None}
# The proposer settings a command that expands queries takes (the encoder's knobs and the LLM's endpoint).
PROPOSER = ("backend.backend", "backend.model", "backend.base_url", "backend.encoder.model",
            "backend.encoder.proposals", "backend.encoder.entries")
TRACKING = ("tracking.tracking_uri", "tracking.experiment")

OutputJson = typer.Option(None, "--output-json", help="write the job's summary as JSON to this path")
Verbose = typer.Option(False, "--verbose", "-v", help="show the engines' own logs (Ray, Spark, Ivy, the JVM) on the "
                                                      "console instead of in WAREHOUSE/logs/")
Warehouse = typer.Option(..., *OPTION_NAMES["warehouse"], envvar=ENV_VARS["warehouse"],
                         help="warehouse directory or URI")
ProposalTable = typer.Option("enrichment", "--table", help="enrichment (corpus side) | expansions (query side)")


def _field(model: type[BaseModel], path: str) -> tuple[FieldInfo, Any]:
    """The field at a dotted path and its default, the default of an enclosing config instance winning (a job's
    backend defaults to the encoder where BackendConfig's own default is the local LLM)."""
    *outer, last = path.split(".")
    default_owner = None
    for name in outer:
        info = model.model_fields[name]
        owner = info.get_default(call_default_factory=True) if default_owner is None else \
            getattr(default_owner, name)
        model = _model_of(info.annotation)
        default_owner = owner if isinstance(owner, BaseModel) else None
    info = model.model_fields[last]
    if default_owner is not None:
        return info, getattr(default_owner, last)
    return info, (... if info.is_required() else info.get_default(call_default_factory=True))


def _model_of(annotation) -> type[BaseModel]:
    for arg in (annotation, *typing.get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    raise TypeError(f"{annotation} holds no config")


def _cli_type(annotation) -> tuple[type, str]:
    """The option's Python type, and the choices a Literal accepts (said in the help; pydantic checks them so that a
    bad value is one line naming the option, like every other bad value)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        kind, choices = _cli_type(args[0])
        return Optional[kind], choices
    if typing.get_origin(annotation) is Literal:
        return str, " | ".join(map(str, typing.get_args(annotation)))
    if typing.get_origin(annotation) in (dict, list) or annotation in (dict, list):
        return list[str], ""
    return annotation, ""


def _option(path: str, model: type[BaseModel], default_override: dict,
            argument: bool = False) -> tuple[inspect.Parameter, Callable]:
    info, default = _field(model, path)
    kind, choices = _cli_type(info.annotation)
    if path in default_override:
        default = default_override[path]
        kind = kind if default is not None or typing.get_origin(kind) is typing.Union else Optional[kind]
    names = _names(path, kind)
    said = choices and all(c in (info.description or "") for c in choices.split(" | "))
    help_text = OPTION_HELP.get(path) or " ".join(filter(None, (info.description,
                                                                f"({choices})" if choices and not said else "")))
    convert = _converter(info.annotation, names[0])
    if argument:
        option = typer.Argument(default, help=help_text or None, show_default=False)
        return inspect.Parameter(path, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind), convert
    cli_default = [] if kind == list[str] and default in ({}, []) else default
    option = typer.Option(cli_default, *names, help=help_text or None, envvar=ENV_VARS.get(path),
                          show_default=default is not ... and not isinstance(default, (dict, list)))
    # The parameter is named after its option (--doc-backend: doc_backend), as click names it.
    name = names[0].split("/")[0].lstrip("-").replace("-", "_")
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind), convert


def _names(path: str, kind) -> tuple[str, ...]:
    names = OPTION_NAMES.get(path) or OPTION_NAMES.get(path.rsplit(".", 1)[-1]) or ()
    if not names:
        flag = "--" + path.rsplit(".", 1)[-1].replace("_", "-")
        names = (f"{flag}/--no-{flag[2:]}",) if bool in (kind, *typing.get_args(kind)) else (flag,)
    return names


def command_line(name: str, cfg: BaseModel, fields: Sequence[str], defaults: dict | None = None) -> str:
    """The command line that makes `cfg`: `name`, then the options among `fields` (with the command's `defaults`,
    as given to `config_options`) whose value is not the default."""
    parts = [name]
    for path in fields:
        info, default = _field(type(cfg), path)
        default = (defaults or {}).get(path, default)
        value = cfg
        for attr in path.split("."):
            value = getattr(value, attr, None)  # None: an optional nested config that is not there
        if value == default:
            continue
        flag = _names(path, _cli_type(info.annotation)[0])[0]
        if "/" in flag:  # --x/--no-x
            parts.append(flag.split("/")[0 if value else 1])
        elif isinstance(value, dict):
            parts += [f"{flag} {k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in value.items()]
        else:
            parts.append(f"{flag} {','.join(map(str, value)) if isinstance(value, list) else value}")
    return " ".join(parts)


def _converter(annotation, option: str) -> Callable:
    """dict fields are KEY=VALUE options; list fields take repeated or comma-separated values."""
    origin = typing.get_origin(annotation)
    if origin is dict:
        return lambda pairs: key_values(pairs, option)
    if origin is list or list in map(typing.get_origin, typing.get_args(annotation)):
        optional = type(None) in typing.get_args(annotation)  # no value given: None, not an empty list
        return lambda items: None if optional and not items else [v.strip() for item in items or ()
                                                                  for v in item.split(",") if v.strip()]
    return lambda value: value


def config_options(model: type[BaseModel], fields: Sequence[str], defaults: dict | None = None,
                   arguments: Sequence[str] = ()):
    """Decorate a command whose first non-context parameter is `values`: the command gets one option per field path
    in `fields` (default, bounds and help from `model`), and receives `values`, the nested dict those options make
    (`model(**values)` validates it; a command may add what no option sets first). A nested config whose first
    listed field is None (e.g. no --doc-backend) is left out. `defaults` overrides a path's default for this
    command only (None where the command makes an optional config of it); `arguments` are positional."""
    built = [(path, *_option(path, model, defaults or {}, argument=True)) for path in arguments]
    built += [(path, *_option(path, model, defaults or {})) for path in fields]
    selectors = _selectors(model, fields)
    names = [name for _, param, _ in built for name in param.default.param_decls or ()]
    assert len(names) == len(set(names)), f"{model.__name__}: two fields share an option name: {sorted(names)}"

    def decorate(command: Callable) -> Callable:
        own = inspect.signature(command, eval_str=True)
        kept = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own.parameters.values() if p.name != "values"]

        def values_of(kwargs: dict) -> dict:
            """The config's nested values from the parsed options (taken out of `kwargs`)."""
            values: dict = {}
            for path, param, convert in built:
                _put(values, path.split("."), convert(kwargs.pop(param.name)))
            return _drop_unset(values, selectors)

        @functools.wraps(command)
        def wrapper(**kwargs):
            return command(values=values_of(kwargs), **kwargs)

        wrapper.values_of = values_of  # what the options make of a command line, for tests and tools

        arguments = [p for p in kept if isinstance(p.default, typer.models.ArgumentInfo)]
        params = arguments + [p for _, p, _ in built] + [p for p in kept if p not in arguments]
        wrapper.__signature__ = own.replace(parameters=params)
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate


def _put(values: dict, path: list[str], value) -> None:
    for name in path[:-1]:
        values = values.setdefault(name, {})
    values[path[-1]] = value


def _selectors(model: type[BaseModel], fields: Sequence[str]) -> dict[str, str]:
    """Optional nested config -> the first of its listed fields, whose None means "no such config"."""
    out = {}
    for path in fields:
        head = path.split(".")[0]
        if "." in path and head not in out and type(None) in typing.get_args(model.model_fields[head].annotation):
            out[head] = path
    return out


def _drop_unset(values: dict, selectors: dict[str, str]) -> dict:
    """An optional nested config whose selecting option is None is not there at all (no --doc-backend)."""
    for head, path in selectors.items():
        node = values[head]
        for name in path.split(".")[1:]:
            node = node[name]
        if node is None:
            values[head] = None
    return values


def log_engines(ctx: typer.Context, warehouse: str, verbose: bool) -> None:
    """Until the command ends, the engines' output goes to a log file of the warehouse, named at the end (on the
    console when `verbose`)."""
    path = None if verbose else engine_log_path(warehouse, ctx.info_name)
    ctx.with_resource(engine_logs(path))


def dataset_warehouse(dataset: str) -> str:
    from sira.core.datasets import resolve_dataset

    return default_warehouse(resolve_dataset(dataset).name)


def write_json(summary: dict, path: Optional[Path]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")


def key_values(pairs: list[str], option: str) -> dict:
    """KEY=VALUE options -> a dict; a VALUE that reads as JSON (numbers, true, lists) is taken as JSON, else as text."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint=option)
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def with_doc_backend(values: dict) -> dict:
    """--doc-backend NAME: the corpus side's proposer, with the query side's other settings (model, endpoint)."""
    if values.get("doc_backend") is not None:
        values["doc_backend"] = {**values["backend"], "backend": values["doc_backend"]["backend"]}
    return values


def option_errors(exc: ValidationError) -> str:
    """A job config's validation errors, one line each, named by the option that set the value: "--variant:
    'dense' is not one of bm25, doc, ...", not pydantic's multi-line report with a web address."""
    lines = []
    for err in exc.errors(include_url=False):
        fields = [str(part) for part in err["loc"] if isinstance(part, str)]
        if err["type"] == "value_error":  # the config's own check, which names what is wrong
            what = str(err["ctx"]["error"])
        elif err["type"] == "literal_error":
            what = f"{err['input']!r} is not one of {err['ctx']['expected'].replace(' or ', ', ')}"
        else:
            what = f"{err['msg']} (got {err['input']!r})"
        if not fields:  # a check of several fields together
            lines.append(what)
            continue
        path = ".".join(fields)
        names = OPTION_NAMES.get(path) or OPTION_NAMES.get(fields[-1]) or ("--" + fields[-1].replace("_", "-"),)
        option = names[0].split("/")[0]
        if fields[:-1] and path not in OPTION_NAMES:  # a nested config's field (backend.model): its path says which
            option += f" ({path})"
        lines.append(f"{option}: {what}")
    return "\n".join(lines)
