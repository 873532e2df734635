"""A loopback OpenAI-compatible chat-completions server for the enrichment tests.

Real HTTP on 127.0.0.1 (ephemeral port), served from a background thread, so the Ray HTTP stage talks to it
exactly as it would to vLLM serve or a hosted API. Behaviour is switched per test with `reset(mode)`:

- `ok`:       200 with {"keywords": [...]} derived from the prompt's document text, and token usage
- `http500`:  always 500
- `flaky`:    500 on the first attempt of each distinct request, ok afterwards
- `slow`:     sleeps `slow_s` (longer than the client timeout), then answers ok
- `junk`:     200 whose message.content is prose, not JSON
- `not_json`: 200 whose HTTP body is not JSON
- `poison`:   500 forever for documents containing `POISON_MARKER`, ok otherwise
- `rerank`:   ok, and a relevance prompt (one with a 'Passage:' header) gets {"score": N}: N is
              `rerank_scores[word]` of the first word of `rerank_scores` the passage contains (None: prose,
              an unusable answer), else `RERANK_DEFAULT_SCORE`

Every request is recorded (body, status answered) so tests can assert on retries and the request body, and
`max_concurrent` is the most requests it was answering at once (each request records how many on arrival). `delay_s` slows every answer down (used to kill a
job part-way, or to see how many requests a client keeps in flight).

Per document (or query) text, in any mode but the failing ones: `answers` sets the keywords of the answer,
`contents` the message content verbatim (any JSON value: what a misbehaving model writes), `completions` the
whole 200 body verbatim (what a misbehaving server sends).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

MODES = ("ok", "http500", "flaky", "slow", "junk", "not_json", "poison", "rerank")
POISON_MARKER = "POISONPILL"
DOCUMENT_HEADER = "Document:\n"
QUERY_HEADER = "Query:\n"
PASSAGE_HEADER = "Passage:\n"
RERANK_DEFAULT_SCORE = 10
_WORD = re.compile(r"[a-z]+")


def document_of(prompt: str) -> str:
    """The document (or query) part of a SIRA prompt: everything after the last 'Document:' / 'Query:' header."""
    header = DOCUMENT_HEADER if DOCUMENT_HEADER in prompt else QUERY_HEADER
    return prompt.rsplit(header, 1)[-1]


def keywords_for(document: str) -> list[str]:
    """The deterministic answer of mode `ok`: 'alt <word>' for the document's first three distinct words."""
    words = list(dict.fromkeys(_WORD.findall(document.lower())))
    return [f"alt {w}" for w in words[:3]]


@dataclass
class Request:
    body: dict
    status: int | None = None  # None while the answer is pending (or was never sent: client timeout)
    concurrent: int = 0  # requests the server was answering when this one arrived, itself included

    @property
    def prompt(self) -> str:
        return self.body["messages"][-1]["content"]


class FakeOpenAI:
    def __init__(self) -> None:
        self.mode = "ok"
        self.delay_s = 0.0
        self.slow_s = 3.0
        self.answers: dict[str, list[str]] = {}  # document / query text -> the keywords to answer with
        self.contents: dict[str, object] = {}  # document / query text -> the message content to answer with
        self.completions: dict[str, object] = {}  # document / query text -> the whole response body
        self.rerank_scores: dict[str, int | None] = {}  # word -> the score of passages containing it
        self.requests: list[Request] = []
        self.concurrent = 0
        self.max_concurrent = 0
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-openai", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> "FakeOpenAI":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def reset(self, mode: str = "ok", delay_s: float = 0.0) -> "FakeOpenAI":
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {MODES}")
        with self._lock:
            self.mode, self.delay_s = mode, delay_s
            self.answers, self.contents, self.completions = {}, {}, {}
            self.rerank_scores = {}
            self.requests.clear()
            self.max_concurrent = 0
            self._seen.clear()
        return self

    def rerank_content(self, passage: str) -> str:
        """The answer of mode `rerank` to a relevance prompt about `passage`."""
        text = passage.lower()
        score = next((s for word, s in self.rerank_scores.items() if word in text), RERANK_DEFAULT_SCORE)
        return "I would rather not say." if score is None else json.dumps({"score": score})

    def attempts_by_document(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in list(self.requests):
            doc = document_of(r.prompt)
            counts[doc] = counts.get(doc, 0) + 1
        return counts

    # ------------------------------------------------------------------------------------------------------

    def _answer(self, body: dict) -> tuple[int, bytes]:
        prompt = body["messages"][-1]["content"]
        document = document_of(prompt)
        key = hashlib.sha256(prompt.encode()).hexdigest()
        with self._lock:
            mode = self.mode
            first_attempt = key not in self._seen
            self._seen.add(key)
        if mode == "http500" or (mode == "flaky" and first_attempt) or (mode == "poison" and POISON_MARKER in document):
            return 500, json.dumps({"error": {"message": "internal error", "type": "server_error"}}).encode()
        if mode == "not_json":
            return 200, b"<html><body>Bad gateway, try later</body></html>"
        if mode == "slow":
            self._stopping.wait(self.slow_s)
        if document.strip() in self.completions:
            return 200, json.dumps(self.completions[document.strip()]).encode()
        keywords = self.answers.get(document.strip()) or keywords_for(document)
        content = ("Sure! Here are some keywords you might like: heart, attack." if mode == "junk"
                   else json.dumps({"keywords": keywords}))
        content = self.contents.get(document.strip(), content)
        if mode == "rerank" and PASSAGE_HEADER in prompt:
            content = self.rerank_content(prompt.rsplit(PASSAGE_HEADER, 1)[-1])
        completion = {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": body.get("model"),
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": len(str(content).split()),
                      "total_tokens": len(prompt.split()) + len(str(content).split())},
        }
        return 200, json.dumps(completion).encode()

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two sends: without this, Nagle + delayed ACK add ~40 ms per answer.
            disable_nagle_algorithm = True

            def do_POST(self):  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length") or 0)
                request = Request(json.loads(self.rfile.read(length) or b"{}"))
                with fake._lock:
                    fake.requests.append(request)  # on arrival, so attempts the client gave up on count too
                    fake.concurrent += 1
                    fake.max_concurrent = max(fake.max_concurrent, fake.concurrent)
                    request.concurrent = fake.concurrent
                try:
                    if not self.path.endswith("/chat/completions"):
                        status, payload = 404, b'{"error": "not found"}'
                    else:
                        if fake.delay_s:
                            fake._stopping.wait(fake.delay_s)
                        status, payload = fake._answer(request.body)
                finally:
                    with fake._lock:
                        fake.concurrent -= 1
                request.status = status
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def log_message(self, *args):
                pass

        return Handler


@pytest.fixture(scope="session")
def fake_openai_server():
    server = FakeOpenAI().start()
    yield server
    server.stop()


@pytest.fixture
def fake_openai(fake_openai_server) -> FakeOpenAI:
    """The session's fake server, reset to mode `ok` with no recorded requests."""
    return fake_openai_server.reset("ok")
