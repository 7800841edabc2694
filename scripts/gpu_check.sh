#!/usr/bin/env bash
# The prepared GPU check (issue 13): forward costs, step costs with a scripted acceptance, host syncs, the
# compiled static path and the GPU tests (tests/gpu), as one table; under 10 minutes on one H200, nothing
# downloaded. Writes $OUT/gpu_check.json when OUT is set. Details: scripts/gpu_check.py, docs/benchmarks.md.
#   scripts/gpu_check.sh           # on a CUDA machine
#   scripts/gpu_check.sh --smoke   # CPU, tiny model, under a minute: checks the script itself
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHONUNBUFFERED=1 exec python scripts/gpu_check.py "$@"
