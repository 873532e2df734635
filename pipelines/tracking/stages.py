"""What the composite jobs (`sira run`, `sira nightly`) share about their stages."""

from __future__ import annotations


class StageFailed(RuntimeError):
    """A stage of a composite job failed; the message names the stage and the cause."""

    def __init__(self, stage: str, cause: BaseException):
        super().__init__(f"stage {stage!r} failed: {type(cause).__name__}: {cause}")
        self.stage = stage
