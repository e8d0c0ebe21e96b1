#!/usr/bin/env bash
# The oracle-style probe (issue 17): one run of configs/oracle-probe.yaml per oracle style, then
# the report (EM and search hit rate of each fine-tuned student, with 95% Wilson intervals).
# About 3.5 CPU-hours on the project's idle 2-core machine (the config's header has the sums);
# re-running skips finished units and resumes an interrupted one.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
export PYTHONPATH=${PYTHONPATH:-$PWD}
for style in exact agent; do
    "$PYTHON" -m pipeline run --config configs/oracle-probe.yaml experiment="oracle-probe-$style" \
        out_dir="runs/oracle-probe/$style" generate.teacher.oracle_style="$style"
done
"$PYTHON" scripts/oracle_probe_report.py runs/oracle-probe
