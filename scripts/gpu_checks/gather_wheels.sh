#!/usr/bin/env bash
# What scripts/gpu_checks/device_check.py needs on a GPU machine that has torch, transformers,
# accelerate and PEFT but no network: the wheels of TRL, datasets and DeepSpeed (its source
# archive: DeepSpeed publishes no wheel) and of what they import beyond those, at the tested
# versions (constraints.txt, else this .venv's), with SmolLM2's tokenizer. Written into
# scripts/gpu_checks/carry/1, carry/2, ... (gitignored), each at most PART_MIB (default 60) so
# that one call may carry it; prints each part's size.
#
#   bash scripts/gpu_checks/gather_wheels.sh              # for this machine's python (PYTHON_VERSION=3.12 for another)
#
# pip downloads --no-deps exactly the list below: a machine that already has one of them keeps
# its own (the check's environment line says what is missing there). PYTHON_VERSION / PLATFORM:
# the GPU machine's python (e.g. 3.12) and platform tag, when they differ from this machine's.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
PART_MIB=${PART_MIB:-60}
OUT=scripts/gpu_checks/carry
# TRL -> datasets -> pyarrow, pandas, dill, xxhash, multiprocess, fsspec; DeepSpeed -> hjson,
# ninja, py-cpuinfo, msgpack, pydantic (+ its core), einops
PACKAGES="trl datasets deepspeed pyarrow pandas dill xxhash multiprocess fsspec hjson ninja py-cpuinfo msgpack
pydantic pydantic_core annotated-types typing-inspection einops"
pinned() {  # name==version from constraints.txt, else as installed in this .venv
  local v
  v=$(grep -iE "^$1==" constraints.txt | head -n 1 || true)
  [ -n "$v" ] && { echo "$v"; return; }
  "$PY" -c "import importlib.metadata as m, sys; print(f'{sys.argv[1]}=={m.version(sys.argv[1])}')" "$1"
}
specs=()
for p in $PACKAGES; do specs+=("$(pinned "$p")"); done
target=()
[ -n "${PYTHON_VERSION:-}" ] && target+=(--python-version "$PYTHON_VERSION")
[ -n "${PLATFORM:-}" ] && target+=(--platform "$PLATFORM")
rm -rf "$OUT" && mkdir -p "$OUT/all"
"$PY" -m pip --disable-pip-version-check download --quiet --no-deps ${target[@]+"${target[@]}"} -d "$OUT/all" "${specs[@]}"
"$PY" scripts/gpu_checks/device_check.py --prepare "$OUT/1"
# Largest first into the first part it fits (the tokenizer already in part 1)
"$PY" - "$OUT" "$PART_MIB" <<'PY'
import shutil, sys
from pathlib import Path
out, limit = Path(sys.argv[1]), int(sys.argv[2]) * 2**20
size = lambda p: sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
parts = [size(out / "1")]
for archive in sorted((out / "all").iterdir(), key=size, reverse=True):
    if size(archive) > limit:
        sys.exit(f"error: {archive.name} is {size(archive) / 2**20:.1f} MiB, over PART_MIB")
    i = next((i for i, used in enumerate(parts) if used + size(archive) <= limit), len(parts))
    if i == len(parts):
        parts.append(0)
    (out / str(i + 1)).mkdir(exist_ok=True)
    parts[i] += size(archive)
    shutil.move(str(archive), out / str(i + 1) / archive.name)
shutil.rmtree(out / "all")
for i, used in enumerate(parts, start=1):
    print(f"gather: {out / str(i)}: {used / 2**20:.1f} MiB ({len(list((out / str(i)).glob('*.*')))} archive(s))")
PY
