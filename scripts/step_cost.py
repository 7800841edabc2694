"""Milliseconds per WeDLM step on a random 4-layer d=256 model, for before/after comparisons of the decoder.

Prints the median over `--repeats` of one 128-token greedy decode, divided by its number of forwards. To compare
two versions of the decoder, run this script against each in alternation: the installed package, and a copy of
another commit laid out as an importable package first on PYTHONPATH, e.g.

    git worktree add /tmp/old <commit>
    mkdir -p /tmp/old_pkg && cp -r /tmp/old/wedlm_hf /tmp/old_pkg/ \\
        && cp -r /tmp/old/modeling /tmp/old/generation /tmp/old_pkg/wedlm_hf/
    PYTHONPATH=/tmp/old_pkg python scripts/step_cost.py --vocab 32768   # before
    python scripts/step_cost.py --vocab 32768                           # after

The number of steps must be identical for the two versions (same tokens); only the time may differ.
"""

import argparse
import statistics
import time

import torch
from transformers import GenerationConfig

import wedlm_hf
from wedlm_hf.bench import random_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = random_model(vocab_size=args.vocab, peak=60.0).eval()  # confident: multi-slot steps, as trained
    model.generation_config = GenerationConfig(eos_token_id=None, pad_token_id=0)
    prompt = torch.randint(5, args.vocab - 5, (1, 32))
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        output = model.generate(prompt, max_new_tokens=args.new_tokens, decoding="wedlm", return_dict_in_generate=True)
        seconds.append(time.perf_counter() - start)
    steps = output.wedlm_stats.model_calls
    print(f"{wedlm_hf.__file__}: vocab {args.vocab}: {1000 * statistics.median(seconds) / steps:.2f} ms/step, {steps} steps")


if __name__ == "__main__":
    main()
