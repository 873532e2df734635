"""Corpus-side SIRA logic, engine-free: prompt templates and output parsing (the DF filters are in dfstats).

Prompt templates are files (`prompts/doc/<task>.txt`); a template's version is its task plus a hash of
its text, so editing a template invalidates exactly the enrichments made with it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources


DOC_INPUT_CHARS = 4000
MAX_PHRASES = 10
# A phrase is search vocabulary of a few words: anything longer is junk (no spaces to count words by).
MAX_PHRASE_CHARS = 100
TASKS = ("generic", "fact_check", "argument", "duplicate", "finance", "citation", "factoid_qa", "multihop_qa")
# The task whose prompt suits each BEIR dataset (overridable with --task).
DATASET_TASKS = {
    "scifact": "fact_check", "climate-fever": "fact_check", "fever": "fact_check",
    "arguana": "argument", "webis-touche2020": "argument",
    "quora": "duplicate", "cqadupstack": "duplicate",
    "fiqa": "finance",
    "scidocs": "citation",
    "nq": "factoid_qa", "trec-covid": "generic", "nfcorpus": "generic", "dbpedia-entity": "factoid_qa",
    "hotpotqa": "multihop_qa",
}
JSON_SCHEMA = {
    "type": "object",
    "properties": {"keywords": {"type": "array", "items": {"type": "string"}, "maxItems": MAX_PHRASES}},
    "required": ["keywords"],
}


@dataclass(frozen=True)
class PromptTemplate:
    side: str  # doc | query
    task: str
    text: str

    @property
    def version(self) -> str:
        return f"{self.side}-{self.task}-{hashlib.sha256(self.text.encode()).hexdigest()[:10]}"

    def render(self, document: str, max_n: int, max_phrases: int = MAX_PHRASES) -> str:
        # str.replace, not str.format: templates contain literal JSON braces.
        return (self.text.replace("{max_phrases}", str(max_phrases)).replace("{max_n}", str(max_n))
                .replace("{document}", document))


def check_task(task: str) -> str:
    """`task` when it names a prompt task, else ValueError listing them."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    return task


@lru_cache(maxsize=None)
def load_template(side: str, task: str) -> PromptTemplate:
    check_task(task)
    text = resources.files("sira.core").joinpath(f"prompts/{side}/{task}.txt").read_text("utf-8")
    return PromptTemplate(side, task, text)


def task_for_dataset(name: str | None) -> str:
    return DATASET_TASKS.get((name or "").lower(), "generic")


def document_input(title: str, text: str, max_chars: int = DOC_INPUT_CHARS) -> str:
    """`title + ". " + text`, cut at max_chars (the reference's document input)."""
    return (f"{title}. {text}" if title else text)[:max_chars]


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)
_SPACES = re.compile(r"\s+")
_MARKUP = re.compile(r"<[^<>]*>")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def parse_phrases(raw: str | None, max_phrases: int = MAX_PHRASES, max_words: int = 4) -> tuple[list[str], str | None]:
    """Phrases from an LLM's output, and an error when the output is unusable. Never raises.

    Accepts {"keywords": [...]}, a bare JSON list, JSON inside code fences or surrounded by prose.
    Phrases lose markup tags and control characters, are trimmed, de-duplicated (case-insensitively), kept to
    max_words words, MAX_PHRASE_CHARS characters and max_phrases.
    """
    if raw is None or not raw.strip():
        return [], "empty output"
    try:
        value = _first_json(raw)
    except RecursionError:
        return [], f"JSON nested too deeply in output: {raw[:80]!r}"
    if value is None:
        return [], f"no JSON found in output: {raw[:80]!r}"
    if isinstance(value, dict):
        value = next((value[k] for k in ("keywords", "phrases", "terms", "queries") if k in value), None)
    if not isinstance(value, list):
        return [], "JSON has no list of keywords"
    phrases, seen = [], set()
    for item in value:
        if not isinstance(item, str):
            continue
        phrase = _SPACES.sub(" ", _CONTROL.sub(" ", _MARKUP.sub(" ", item))).strip(" .,;:\"'")
        if (not phrase or len(phrase.split(" ")) > max_words or len(phrase) > MAX_PHRASE_CHARS
                or phrase.lower() in seen):
            continue
        seen.add(phrase.lower())
        phrases.append(phrase)
        if len(phrases) == max_phrases:
            break
    if not phrases and value:
        return [], "no usable phrase in the keyword list"
    return phrases, None


def _first_json(raw: str):
    candidates = [m.group(1) for m in _FENCE.finditer(raw)] + [raw]
    # strict=False: a raw control character inside a string (models emit tabs and newlines) is cleaned from its
    # phrase instead of making the whole answer unusable.
    decoder = json.JSONDecoder(strict=False)
    for text in candidates:
        for start, ch in enumerate(text):
            if ch in "{[":
                try:
                    return decoder.raw_decode(text, start)[0]
                except json.JSONDecodeError:
                    continue
    return None
