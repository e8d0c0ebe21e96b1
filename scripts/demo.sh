#!/usr/bin/env bash
# Set up (if needed) and run the whole CPU demo grid: generate -> filter -> train -> eval -> plot.
# Re-running finishes at once; an interrupted run resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pipeline run --config configs/demo.yaml "$@"
