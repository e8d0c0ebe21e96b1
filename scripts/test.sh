#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite, slow end-to-end tests included.
# Pass pytest options through, e.g. `scripts/test.sh -m "not slow"` for the fast subset.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
