#!/usr/bin/env bash
# The vLLM plugin's checks on a CUDA machine with vLLM (CUDA build) and wedlm-hf installed (`pip install wedlm-hf`;
# add `--no-deps` if that vLLM pins a transformers outside wedlm-hf's range), nothing downloaded. vLLM's defaults:
# compiled, its default CUDA-graph mode (FULL_AND_PIECEWISE: a drafting step of 1 + K tokens per request and a
# batch of one-token rows are both replayed as whole graphs), bf16, prefix caching. On the embedded checkpoint:
# greedy WeDLM == plain vLLM, tokens per forward (the drafter's counters) and wall-clock against plain vLLM one
# request at a time and 48 at once, sampling (chi-square of the first two tokens' joint distribution, WeDLM vs plain
# vLLM, as tests/test_lossless_sampling.py does for transformers), and tensor parallel 1 vs 2 where two GPUs exist.
#   scripts/gpu_vllm_check.sh            # writes $OUT/gpu_vllm_check.json when OUT is set
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHONUNBUFFERED=1 exec python - <<'PY'
import collections, json, os, statistics, time, torch
from scipy.stats import chi2_contingency
from vllm import LLM, SamplingParams
import wedlm_vllm

model, report = "wedlm_hf/checkpoints/wedlm-tiny-code", {}
counting = [", ".join(str(n) for n in range(s, s + 8)) + ", " for s in (1, 98, 195, 292)]
prompts = counting + ["def read_lines(path):\n"]
many = [p.replace("1, ", f"{i}, ", 1) for i in range(12) for p in counting]
greedy = SamplingParams(temperature=0, max_tokens=64)


def timed(llm, batch):
    """Seconds per round (median of 3) and the token ids, one request at a time or `batch` at once."""
    times, tokens = [], None
    for _ in range(3):
        start = time.perf_counter()
        if batch is None:
            tokens = [list(llm.generate([p], greedy, use_tqdm=False)[0].outputs[0].token_ids) for p in prompts]
        else:
            tokens = [list(o.outputs[0].token_ids) for o in llm.generate(batch, greedy, use_tqdm=False)]
        times.append(time.perf_counter() - start)
    return statistics.median(times), tokens


for tp in [1, 2][: max(1, min(2, torch.cuda.device_count()))]:
    common = dict(model=model, dtype="bfloat16", tensor_parallel_size=tp, seed=0, gpu_memory_utilization=0.2)
    base, llm = LLM(**common), LLM(speculative_config=wedlm_vllm.speculative_config(), **common)
    row = {"cudagraph_mode": str(llm.llm_engine.vllm_config.compilation_config.cudagraph_mode)}
    for name, batch in (("one_at_a_time", None), ("48_at_once", many)):
        wedlm_vllm.stats(llm, reset=True)
        (plain_s, plain), (wedlm_s, wedlm) = timed(base, batch), timed(llm, batch)
        stats = wedlm_vllm.stats(llm, reset=True)
        row[name] = {"identical": sum(a == b for a, b in zip(plain, wedlm)), "of": len(plain),
                     "tokens_per_forward": stats["tokens"] / max(1, stats["forwards"]),
                     "wall_clock_plain_over_wedlm": plain_s / wedlm_s}
    if tp == 1:  # sampling: the first two tokens' joint counts, WeDLM vs plain vLLM, 20,000 samples each
        sampled = SamplingParams(temperature=1.0, max_tokens=2, n=20000, seed=0)
        counts = [collections.Counter(tuple(c.token_ids) for c in engine.generate([prompts[-1]], sampled)[0].outputs)
                  for engine in (llm, base)]
        keys = sorted(set(counts[0]) | set(counts[1]), key=lambda k: -(counts[0][k] + counts[1][k]))[:30]
        row["sampling_p_value"] = chi2_contingency([[c[k] for k in keys] for c in counts]).pvalue
    report[f"tp{tp}"] = row
    del base, llm
print(json.dumps(report, indent=2))
if os.environ.get("OUT"):
    open(os.path.join(os.environ["OUT"], "gpu_vllm_check.json"), "w").write(json.dumps(report, indent=2))
PY
