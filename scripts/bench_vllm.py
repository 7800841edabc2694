"""WeDLM drafting inside vLLM against plain vLLM, side by side in one run (run in the vLLM environment).

Both engines are built in this process (each with its own engine-core process; with `--in-process`, inside this
one, where each process's placement on the cores, which moved the ratio by about 10% between runs on a 2-core
machine, is the same for both arms) from the same checkpoint, under
vLLM's default compilation (`--eager` for enforce_eager); per repeat, each prompt runs alone through one and then
the other (the order alternating between repeats), so load drift hits both alike; `--concurrent N` sends the set
repeated to N requests at once instead. Printed per prompt set, `wedlm-hf bench`-style: tokens returned per target forward, the
forwards as the drafter counts them (vLLM's own acceptance metrics count every mask slot as a rejected draft), target forwards per
generated token, tokens/s and the median of the per-repeat wall-clock ratios plain / WeDLM, and how many outputs
are identical to plain vLLM's greedy output.

Prompt sets are JSONL files (`{"prompt": ...}` per line, what `wedlm-hf bench --prompts` reads). Made with the
project environment, the same sets `wedlm-hf bench` uses:

    python -c "from wedlm_hf.bench.prompts import *; import json; [open(f'/tmp/{n}.jsonl','w').write(''.join(json.dumps({'prompt': p})+'\\n' for p in f(4))) for n, f in (('counting', counting_prompts), ('code', code_prompts))]"
    python scripts/bench_vllm.py --set counting=/tmp/counting.jsonl --set code=/tmp/code.jsonl [--model PATH --mask-token-id ID]
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default takes a large share of a small machine

import wedlm_vllm  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402

DEFAULT_MODEL = str(Path(__file__).resolve().parents[1] / "wedlm_hf" / "checkpoints" / "wedlm-tiny-code")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="checkpoint folder (default: the embedded one)")
    parser.add_argument("--mask-token-id", type=int, default=None, help="for a checkpoint whose config has none")
    parser.add_argument("--set", action="append", required=True, metavar="NAME=FILE.jsonl", help="a prompt set")
    parser.add_argument("--slots", type=int, default=wedlm_vllm.DEFAULT_SLOTS, help="num_speculative_tokens")
    parser.add_argument("--prompt-lookup", action="store_true")
    parser.add_argument("--forward-scale", type=int, default=None, help="the cost model's scale (tokens; default: the device type's)")
    parser.add_argument("--eager", action="store_true", help="enforce_eager=True (default: vLLM's compilation)")
    parser.add_argument("--concurrent", type=int, default=None, metavar="N",
                        help="send N requests at once (the set repeated), not one prompt at a time")
    parser.add_argument("--in-process", action="store_true",
                        help="both engines' cores in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): no placement of "
                             "four processes on the cores between the arms; the steps run serially with the frontend")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON")
    return parser.parse_args()


def timed(llm: LLM, prompts: list[str], params: SamplingParams) -> tuple[float, list[list[int]]]:
    """Seconds for `prompts` sent at once, and their token ids."""
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start, [list(output.outputs[0].token_ids) for output in outputs]


def run_set(plain: LLM, wedlm: LLM, prompts: list[str], args: argparse.Namespace) -> dict:
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=False)
    ratios, plain_times, wedlm_times, identical, tokens = [], [], [], 0, 0
    if args.concurrent:  # one group: the set repeated to `concurrent` requests, all sent at once
        groups = [[prompts[i % len(prompts)] for i in range(args.concurrent)]]
    else:
        groups = [[prompt] for prompt in prompts]
    wedlm_vllm.stats(wedlm, reset=True)
    for repeat in range(args.repeats):
        plain_total = wedlm_total = 0.0
        for index, group in enumerate(groups):
            runs = {}
            for name in (("plain", "wedlm") if (repeat + index) % 2 == 0 else ("wedlm", "plain")):
                runs[name] = timed(plain if name == "plain" else wedlm, group, params)
            plain_total += runs["plain"][0]
            wedlm_total += runs["wedlm"][0]
            if repeat == 0:
                identical += sum(a == b for a, b in zip(runs["plain"][1], runs["wedlm"][1]))
                tokens += sum(map(len, runs["plain"][1]))
        ratios.append(plain_total / wedlm_total)
        plain_times.append(plain_total)
        wedlm_times.append(wedlm_total)
    counts = wedlm_vllm.stats(wedlm)
    return {
        "prompts": sum(map(len, groups)),
        "tokens": tokens,
        "forwards_per_token": counts["forwards"] / (tokens * args.repeats),  # tokens returned, not accepted
        "tokens_per_forward": tokens * args.repeats / counts["forwards"],
        "drafter": counts,
        "plain_tokens_per_s": tokens / statistics.median(plain_times),
        "wedlm_tokens_per_s": tokens / statistics.median(wedlm_times),
        "speedup": statistics.median(ratios),
        "identical": identical,
    }


def main() -> None:
    args = parse_args()
    if args.in_process:  # read by vLLM when it builds an engine
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    sets = {}
    for item in args.set:
        name, _, path = item.partition("=")
        sets[name] = [json.loads(line)["prompt"] for line in Path(path).read_text().splitlines() if line.strip()]
    common = dict(model=args.model, dtype="float32", enforce_eager=args.eager, max_model_len=1024, seed=0)
    plain = LLM(**common)
    spec = wedlm_vllm.speculative_config(args.slots, args.mask_token_id, args.prompt_lookup, args.forward_scale)
    wedlm = LLM(speculative_config=spec, **common)
    warm = SamplingParams(temperature=0, max_tokens=8)
    for llm in (plain, wedlm):
        llm.generate(["1, 2, 3,"], warm, use_tqdm=False)
    results = {name: run_set(plain, wedlm, prompts, args) for name, prompts in sets.items()}
    mode = ("eager" if args.eager else "compiled") + (", engines in this process" if args.in_process else "")
    at_once = f"{args.concurrent} requests at once" if args.concurrent else "one request at a time"
    print(f"model {args.model}, {args.slots} slots, {args.max_tokens} new tokens, {mode}, {at_once}, "
          f"medians of {args.repeats} repeats")
    print("| set | tokens/forward | forwards/token | plain tok/s | wedlm tok/s | wall-clock plain/wedlm | identical |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['tokens_per_forward']:.2f} | {r['forwards_per_token']:.3f} | {r['plain_tokens_per_s']:.1f} "
              f"| {r['wedlm_tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r['identical']}/{r['prompts']} |")
    scale = wedlm_vllm.stats(wedlm)["forward_scale"]
    print(f"cost model: a step carries {scale} tokens for the price of its fixed part (forward_scale, "
          f"{'given' if args.forward_scale else 'declared for this device type'})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
