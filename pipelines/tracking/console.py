"""What a job shows a person: logs and progress on stderr (results go to stdout), one bar per stage on a terminal
and periodic plain lines with counts, rate and ETA elsewhere; the engines' own output (Ray, Spark and Ivy, py4j,
the JVM's log4j) goes to a log file unless it is asked for."""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

console = Console(stderr=True, log_path=False)  # a log line says what happened, not which source line said it

# How often a progress line is printed where no bar can be drawn (a log file, a CI job, `make run > log`).
PROGRESS_INTERVAL_S = 15.0
LOGS_FOLDER = "logs"


@contextmanager
def progress_bar(description: str, total: int | None, unit: str = "items",
                 interval_s: float = PROGRESS_INTERVAL_S) -> Iterator[Callable[[int], None]]:
    """Yields `advance(n)`; draws a bar on a terminal, otherwise prints a progress line every `interval_s` seconds
    and one when done."""
    if console.is_terminal:
        columns = [SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn(unit), TaskProgressColumn(), TimeElapsedColumn(), TextColumn("ETA"),
                   TimeRemainingColumn()]
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task(description, total=total)
            yield lambda n=1: progress.advance(task, n)
        return
    counter = _Counter()
    started = time.monotonic()

    def line(finished: bool = False) -> str:
        return progress_line(description, counter.done, total, unit, time.monotonic() - started, finished)

    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(interval_s):
            plain_log(line())

    ticker = threading.Thread(target=tick, name=f"progress {description}", daemon=True)
    ticker.start()
    try:
        yield counter.advance
    finally:
        stop.set()
        ticker.join()
    plain_log(line(finished=True))


def plain_log(text: str) -> None:
    """A timestamped line that stays one line (a log line wraps at 80 columns where there is no terminal)."""
    console.print(f"[{datetime.now():%H:%M:%S}] {text}", soft_wrap=True, markup=False, highlight=False)


class _Counter:
    def __init__(self):
        self.done = 0

    def advance(self, n: int = 1) -> None:
        self.done += n


def progress_line(description: str, done: int, total: int | None, unit: str, elapsed_s: float,
                  finished: bool = False) -> str:
    """'enrich: 1,200/5,183 docs (23%), 9.4 docs/s, ETA 7 min 04 s'; without a total, the count, rate and time so
    far; once finished, the time it took."""
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    count = f"{done:,}/{total:,} {unit} ({done / total:.0%})" if total else f"{done:,} {unit}"
    text = f"{description}: {count}, " + (f"{rate:,.1f}" if rate >= 1 else f"{rate:.2f}") + f" {unit}/s"
    if finished:
        return f"{text}, done in {duration(elapsed_s)}"
    if total:
        return f"{text}, ETA " + (duration((total - done) / rate) if rate > 0 else "unknown")
    return f"{text}, {duration(elapsed_s)} so far"


def duration(seconds: float) -> str:
    """'42 s', '7 min 04 s', '1 h 05 min'."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def engine_log_path(warehouse: str, command: str) -> Path:
    """WAREHOUSE/logs/COMMAND-TIME.log for a local warehouse; ./logs/... beside an object-store one."""
    folder = Path(LOGS_FOLDER) if "://" in warehouse else Path(warehouse) / LOGS_FOLDER
    return folder / f"{command}-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}.log"


@contextmanager
def engine_logs(path: Path | None) -> Iterator[None]:
    """While open, what the engines print goes to `path` (None: to the console, as they print it), and its name
    is shown at the end (unless nothing was written).

    At the file descriptor, not Python's sys.stderr: Ray's core worker writes to fd 2 from C++, and Ray's processes
    and the JVM (Spark, its Ivy jar resolution, log4j) inherit it when they start; Python's warnings and the engines'
    Python loggers follow sys.stderr, which points at the file too. The console keeps the stream it had."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved_fd = os.dup(2)
    shown = console.file
    real = _stream_beside(shown, saved_fd)
    log = open(path, "a", buffering=1, encoding="utf-8", errors="replace")
    os.dup2(log.fileno(), 2)
    python_stderr, sys.stderr = sys.stderr, log
    console.file = real
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr = python_stderr
        os.dup2(saved_fd, 2)
        if real is not shown:
            real.close()  # closes saved_fd with it
        else:
            os.close(saved_fd)
        console.file = None  # follows sys.stderr again
        log.close()
        if path.stat().st_size:
            plain_log(f"engine logs: {path}")
        else:
            path.unlink()
            with suppress(OSError):  # the folder holds other logs
                path.parent.rmdir()


def _stream_beside(stream, saved_fd: int):
    """Where the console writes while fd 2 is the log: its own stream, unless that stream is fd 2 itself (a real
    terminal or file), in which case a stream on the saved copy of fd 2."""
    try:
        is_fd2 = stream.fileno() == 2
    except (AttributeError, OSError, ValueError):
        is_fd2 = False  # a stream of its own (a test runner's buffer)
    if not is_fd2:
        return stream
    return os.fdopen(saved_fd, "w", buffering=1, encoding=getattr(stream, "encoding", None) or "utf-8",
                     errors="replace", closefd=True)
