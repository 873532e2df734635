"""Local processes: whether the one that owns a scratch folder (Spark's, the shard cache's) is still running."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
