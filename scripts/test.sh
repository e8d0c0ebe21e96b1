#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite, slow end-to-end tests included.
# Pass pytest options through, e.g. `scripts/test.sh -m "not slow"` for the fast subset.
#
# Two pytest-xdist workers by default: many slow tests keep one core busy at a time (a single
# `accelerate launch` process, vLLM's one CPU worker, a server waiting on its client), so a second
# worker uses the other core; serially the suite took about 30 min on 2 cores. `--dist loadgroup`
# with the groups tests/conftest.py sets keeps each test file, and all real-vLLM tests, on one
# worker. Pass `-n 0` (or any -n / --numprocesses, or `-p no:xdist`) to choose yourself.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
workers=(-n 2 --dist loadgroup --no-loadscope-reorder)
for arg in "$@"; do
  case "$arg" in
    -n|-n[0-9]*|--numprocesses|--numprocesses=*|no:xdist|-pno:xdist) workers=() ;;
  esac
done
# One OpenMP thread per process while two workers share the cores: torch's default (a thread per
# core in every process) oversubscribed them and its threads spun waiting on each other; measured
# on 2 cores, the README test beside the GRPO tests ran in 137 s with it against 242 s without.
# A serial run (-n 0) keeps torch's default. Set OMP_NUM_THREADS yourself to choose.
if ((${#workers[@]})); then
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi
# --durations: the slowest tests at the end of every run, so that a run over the 25-minute goal says where it went
exec .venv/bin/python -m pytest "${workers[@]}" --durations=25 "$@"
