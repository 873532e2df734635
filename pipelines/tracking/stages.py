"""What the composite jobs (`sira run`, `sira nightly`) share about their stages."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


class StageFailed(RuntimeError):
    """A stage of a composite job failed; the message names the stage and the cause."""

    def __init__(self, stage: str, cause: BaseException):
        super().__init__(f"stage {stage!r} failed: {type(cause).__name__}: {cause}")
        self.stage = stage


class Stages:
    """The stages of a composite job, run one after another: each is announced (`announce`, then the caller's
    `on_stage`), timed into `seconds` (a failed one too), and its failure raised again as StageFailed naming it."""

    def __init__(self, announce: Callable[[str], None], on_stage: Callable[[str], None] | None = None):
        self.announce, self.on_stage = announce, on_stage
        self.seconds: dict[str, float] = {}

    def run(self, name: str, fn: Callable[[], T]) -> T:
        if self.on_stage:
            self.on_stage(name)
        self.announce(name)
        started = time.perf_counter()
        try:
            return fn()
        except Exception as exc:
            raise StageFailed(name, exc) from exc
        finally:
            self.seconds[name] = time.perf_counter() - started

    def tracked(self, tracker, name: str, fn: Callable[[], T], metrics: Callable[[T], dict], tags: dict) -> T:
        """`run`, in a child run of `tracker` tagged `tags` and the stage's name, with `metrics(out)` and its seconds."""
        with tracker.run(name, nested=True, tags={**tags, "sira.step": name}):
            out = self.run(name, fn)
            tracker.metrics({**metrics(out), "seconds": self.seconds[name]})
        return out
