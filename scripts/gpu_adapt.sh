#!/usr/bin/env bash
# The GPU recipe of the SmolLM2 adaptation (docs/finetune.md): the CPU script's data, objective and evaluation, in
# bf16 on one GPU, with a larger batch and a 10-minute training budget; prints the same before/after table.
# Writes into $OUT when set (the device tool's output folder), else runs/smollm2-wedlm-gpu.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${OUT:-runs}/smollm2-wedlm-gpu"
PYTHONUNBUFFERED=1 exec python scripts/adapt_smollm2.py --work "$WORK" --phase data train evaluate --bf16 \
    --minutes 10 --max-steps 1500 --batch-size 32 --seq-len 192 --code-prompts 512 --chat-prompts 160 \
    --counting-docs 2400 --code-chars 2000000 --eval-threads 16 "$@"
