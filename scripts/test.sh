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
# DeepSpeed on a CPU compiles its shared-memory collectives (deepspeed_shm_comm) when its first
# process group starts: 24 s on 2 idle cores, 60-240 s under load. Built here once, before the
# first test, in this environment's own folder (pipeline/train/shm_op.py: checkouts with other
# environments do not rebuild it for each other), which every test's launch then finds through
# TORCH_EXTENSIONS_DIR; a build lock left by a killed build is cleared. On a GPU machine it
# builds nothing. A failure is said and the tests go on (the DeepSpeed ones will fail with
# DeepSpeed's own message).
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$(.venv/bin/python -c 'from pipeline.train.shm_op import extensions_dir; print(extensions_dir())')}"
if ! built=$(.venv/bin/python -m pipeline.train.shm_op 2>&1); then
  echo "test: DeepSpeed's CPU communication op did not build: $(tail -n 1 <<<"$built")" >&2
fi
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
