#!/usr/bin/env bash
# What each extra costs to install: for every extra, a fresh venv with torch 2.13 CPU in it, then
# `pip install ".[EXTRA]"` with pip's cache off, timed; prints seconds and the MB it added: the extras table of docs/install.md.
# Run from the repository root: bash scripts/install_cost.sh [EXTRA ...]   (default: all, "base" = no extra)
set -u
extras=("$@")
[ ${#extras[@]} -gt 0 ] || extras=(base real finetune serve demo eval train dev)
export PIP_NO_CACHE_DIR=1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for extra in "${extras[@]}"; do
    venv="$work/venv-$extra"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip >/dev/null 2>&1
    "$venv/bin/pip" install -q torch==2.13.0 >/dev/null 2>&1
    before=$(du -sm "$venv" | cut -f1)
    spec="."
    [ "$extra" = base ] || spec=".[$extra]"
    start=$(date +%s.%N)
    "$venv/bin/pip" install -q "$spec" >"$work/$extra.log" 2>&1
    status=$?
    end=$(date +%s.%N)
    after=$(du -sm "$venv" | cut -f1)
    printf '%-9s rc=%d seconds=%.0f MB=%d\n' "$extra" "$status" "$(echo "$end - $start" | bc)" $((after - before))
    rm -rf "$venv"
done
