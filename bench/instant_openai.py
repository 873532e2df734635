"""An OpenAI-compatible chat-completions server that answers every request at once, for measuring the pipeline
around a model rather than the model.

    python bench/instant_openai.py [--port 0] [--max-seconds 3600]

Every `POST .../chat/completions` gets the same valid answer (`{"keywords": [...]}` with a usage block) as soon as
its body has arrived; anything else gets a 404. It is a bare asyncio protocol (HTTP/1.1 keep-alive, no request
parsing beyond the headers' Content-Length), so that on a small machine the server takes as little of the CPU the
measured pipeline needs as possible. It prints `PORT <n>` when it listens, stops when its stdin closes (its parent
ended, however it ended) or after `--max-seconds`, and then prints one JSON line of counters: requests answered,
the most connections open at once (how many requests the client kept in flight) and its own CPU seconds.

`start()` runs it as a child process of the caller.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

KEYWORDS = ["synthetic phrase", "loopback answer", "pipeline overhead"]
_CONTENT = json.dumps({"keywords": KEYWORDS})
_COMPLETION = json.dumps({
    "id": "chatcmpl-instant", "object": "chat.completion", "created": 0, "model": "instant",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": _CONTENT}}],
    "usage": {"prompt_tokens": 300, "completion_tokens": 12, "total_tokens": 312},
}).encode()
_OK = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
       + str(len(_COMPLETION)).encode() + b"\r\n\r\n" + _COMPLETION)
_NOT_FOUND_BODY = b'{"error": "not found"}'
_NOT_FOUND = (b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(_NOT_FOUND_BODY)).encode() + b"\r\n\r\n" + _NOT_FOUND_BODY)


class Counters:
    def __init__(self) -> None:
        self.requests = 0
        self.open_connections = 0
        self.max_open_connections = 0


class InstantHTTP(asyncio.Protocol):
    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self.buffer = bytearray()
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.counters.open_connections += 1
        self.counters.max_open_connections = max(self.counters.max_open_connections, self.counters.open_connections)

    def connection_lost(self, exc) -> None:
        self.counters.open_connections -= 1

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return  # the body is still arriving
            del self.buffer[:end + 4 + length]
            method, path = (head.split(" ", 2) + ["", ""])[:2]
            found = method == "POST" and path.endswith("/chat/completions")
            self.counters.requests += found
            self.transport.write(_OK if found else _NOT_FOUND)


async def serve(port: int, max_seconds: float) -> Counters:
    counters = Counters()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: InstantHTTP(counters), "127.0.0.1", port, backlog=1024)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    stdin_closed = asyncio.Event()

    def read_stdin() -> None:  # an empty read: the parent closed the pipe, or died
        if not os.read(0, 65536):
            loop.remove_reader(0)
            stdin_closed.set()

    loop.add_reader(0, read_stdin)
    try:
        await asyncio.wait_for(stdin_closed.wait(), timeout=max_seconds)
    except asyncio.TimeoutError:
        pass
    server.close()
    return counters


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=3600.0)
    args = ap.parse_args(argv)
    started = time.perf_counter()
    counters = asyncio.run(serve(args.port, args.max_seconds))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"requests": counters.requests, "max_open_connections": counters.max_open_connections,
                      "user_cpu_s": usage.ru_utime, "system_cpu_s": usage.ru_stime,
                      "seconds": time.perf_counter() - started}), flush=True)


class InstantServer:
    """A running server child: its base URL, and its counters once stopped."""

    def __init__(self, proc: subprocess.Popen, port: int) -> None:
        self.proc = proc
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.stats: dict = {}

    def stop(self) -> dict:
        if not self.stats:
            out, _ = self.proc.communicate(input=b"", timeout=30)  # closing stdin stops it
            self.stats = json.loads(out.decode().strip().splitlines()[-1])
        return self.stats


@contextmanager
def start(max_seconds: float = 3600.0) -> Iterator[InstantServer]:
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--max-seconds", str(max_seconds)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        first = proc.stdout.readline().decode()
        if not first.startswith("PORT "):
            raise RuntimeError(f"the instant server did not start (exit code {proc.poll()}): {first!r}")
        server = InstantServer(proc, int(first.split()[1]))
        yield server
        server.stop()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
