#!/usr/bin/env bash
# The vLLM plugin's checks on a CUDA machine with vLLM (CUDA build) and wedlm-hf installed (`pip install wedlm-hf`;
# add `--no-deps` if that vLLM pins a transformers outside wedlm-hf's 5.19 through 5.24),
# nothing downloaded: the embedded checkpoint in bf16 with CUDA graphs (piecewise: the drafter reads each forward
# in Python; whole-graph replays make it draft nothing, with a warning), greedy WeDLM == plain vLLM, forwards per
# token, sampling (chi-square of the first two tokens' joint distribution, WeDLM vs plain vLLM, as
# tests/test_lossless_sampling.py does for transformers), and tensor parallel 1 vs 2 where two GPUs exist.
#   scripts/gpu_vllm_check.sh            # writes $OUT/gpu_vllm_check.json when OUT is set
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHONUNBUFFERED=1 exec python - <<'PY'
import collections, json, os, torch
from scipy.stats import chi2_contingency
from vllm import LLM, SamplingParams
import wedlm_vllm

model, report = "wedlm_hf/checkpoints/wedlm-tiny-code", {}
prompts = [", ".join(str(n) for n in range(s, s + 8)) + ", " for s in (1, 98, 195, 292)] + ["def read_lines(path):\n"]
greedy = SamplingParams(temperature=0, max_tokens=64)
for tp in [1, 2][: max(1, min(2, torch.cuda.device_count()))]:
    common = dict(model=model, dtype="bfloat16", tensor_parallel_size=tp, seed=0,
                  compilation_config={"cudagraph_mode": "PIECEWISE"}, gpu_memory_utilization=0.2)
    base = LLM(**common)
    plain = [list(o.outputs[0].token_ids) for o in base.generate(prompts, greedy, use_tqdm=False)]
    llm = LLM(speculative_config=wedlm_vllm.speculative_config(), **common)
    wedlm = [list(llm.generate([p], greedy, use_tqdm=False)[0].outputs[0].token_ids) for p in prompts]
    stats = wedlm_vllm.stats(llm, reset=True)
    report[f"tp{tp}"] = {"identical": sum(a == b for a, b in zip(plain, wedlm)), "of": len(prompts),
                         "forwards_per_token": stats["forwards"] / stats["tokens"]}
    if tp == 1:  # sampling: the first two tokens' joint counts, WeDLM vs plain vLLM, 20,000 samples each
        sampled = SamplingParams(temperature=1.0, max_tokens=2, n=20000, seed=0)
        counts = [collections.Counter(tuple(c.token_ids) for c in engine.generate([prompts[-1]], sampled)[0].outputs)
                  for engine in (llm, base)]
        keys = sorted(set(counts[0]) | set(counts[1]), key=lambda k: -(counts[0][k] + counts[1][k]))[:30]
        report["sampling_p_value"] = chi2_contingency([[c[k] for k in keys] for c in counts]).pvalue
    del base, llm
print(json.dumps(report, indent=2))
if os.environ.get("OUT"):
    open(os.path.join(os.environ["OUT"], "gpu_vllm_check.json"), "w").write(json.dumps(report, indent=2))
PY
