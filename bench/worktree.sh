#!/usr/bin/env bash
# A git worktree of REV at DIR whose `sira` namespace is its own code, for a benchmark that must measure REV while
# the main checkout changes. The editable install maps sira.core, sira.pipelines and sira.jobs to the main
# checkout's folders; a worktree's sira/ folder holds none of them, so with PYTHONPATH=DIR alone those imports fell
# through to the main checkout. The links below make DIR's own folders win.
#
#   bench/worktree.sh REV DIR
#   cd DIR && PYTHONPATH=DIR /path/to/main/.venv/bin/python bench/scale.py ...
set -euo pipefail
rev=${1:?usage: bench/worktree.sh REV DIR}
dir=${2:?usage: bench/worktree.sh REV DIR}
git worktree add --detach "$dir" "$rev"
ln -s ../sira_core "$dir/sira/core"
ln -s ../pipelines "$dir/sira/pipelines"
ln -s ../jobs "$dir/sira/jobs"
echo "worktree $dir at $(git -C "$dir" rev-parse --short HEAD): run its benches with PYTHONPATH=$dir"
