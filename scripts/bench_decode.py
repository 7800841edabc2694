"""Issue 2: does the KV cache make WeDLM's cost per token flat, and is one-slot-per-step WeDLM as cheap as AR?

On one random 4-layer d=256 WeDLM model and one prompt, times four arms at 64..512 new tokens (EOS disabled, so
lengths are exact), interleaved per repeat: WeDLM cached at one slot per step (threshold None), WeDLM cached at
the default threshold, the cache-free reference, and transformers' greedy `generate()`; plus WeDLM with a window
of one slot, whose forwards feed 2 tokens like AR's 1, so its gap to greedy is the strategy's own per-step
overhead rather than the cost of a 16-slot window forward on a CPU. Prints ms per token and
the median over repeats of each arm's paired time ratio to greedy. Expected: cached ms/token flat in the length,
the reference's growing with it, and cached @1 slot/step within 1.3x of greedy.

    python scripts/bench_decode.py [--repeats 3] [--lengths 64,128,256,512] [--threads 1]
"""

import argparse
import statistics

import torch

from wedlm_hf.bench import BASELINE, FAMILIES, Arm, build_arms, random_model, time_vs_length
from wedlm_hf.bench.prompts import random_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lengths", default="64,128,256,512")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = [int(n) for n in args.lengths.split(",")]

    model = random_model()
    prompt = random_prompts(1, 32, model.config.vocab_size)[0]
    arms = build_arms(("ar", "wedlm", "nocache"), thresholds=(None,))
    one_slot_window = {"wedlm_entropy_threshold": None, "wedlm_window_size": 1}
    arms.append(Arm("wedlm@1slot,W=1", "wedlm", FAMILIES["wedlm"] | one_slot_window, None))
    samples = time_vs_length(model, arms, prompt, lengths, args.repeats)

    print(f"torch threads {torch.get_num_threads()}, {args.repeats} interleaved repeats, medians")
    print("| arm | " + " | ".join(f"{n} tok: ms/tok (x ar)" for n in lengths) + " | ms/tok growth 1st->last |")
    print("|---|" + "---|" * (len(lengths) + 1))
    for arm in arms:
        cells, per_token = [], []
        for n in lengths:
            ms = 1000 * statistics.median(samples[arm.name][n]) / n
            ratio = statistics.median(a / b for a, b in zip(samples[arm.name][n], samples[BASELINE][n]))
            cells.append(f"{ms:.2f} ({ratio:.2f}x)")
            per_token.append(ms)
        print(f"| {arm.name} | " + " | ".join(cells) + f" | {per_token[-1] / per_token[0]:.2f}x |")


if __name__ == "__main__":
    main()
