"""Decoding speed against torch's thread count, interleaved in one run: the figures behind `--threads`' default
(`wedlm_hf/commands/placement.py`). Run it on an idle machine and beside other work (e.g. a busy core) to see why
the default leaves cores free.

    python scripts/threads_cost.py [--model wedlm-tiny-code] [--threads 1 2] [--repeats 3] [--new-tokens 64]
"""

import argparse
import os
import statistics
import time

import torch

import wedlm_hf
from wedlm_hf.loading import load_model_and_tokenizer

PROMPTS = {"counting": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "code": "import os\n\ndef read_config(path):\n    "}
DECODINGS = {"wedlm lossless": {"decoding": "wedlm", "wedlm_lossless": True}, "ar": {"decoding": "ar"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model name wedlm_hf.loading takes (default: embedded)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    model, tokenizer = load_model_and_tokenizer(args.model)
    model = wedlm_hf.enable(model)
    speeds: dict[tuple, list[float]] = {}
    for _ in range(args.repeats):  # interleaved: drift in the machine's load hits every thread count alike
        for threads in args.threads:
            torch.set_num_threads(threads)
            for prompt_name, prompt in PROMPTS.items():
                inputs = tokenizer(prompt, return_tensors="pt")
                for decoding, options in DECODINGS.items():
                    start = time.perf_counter()
                    with torch.inference_mode():
                        model.generate(**inputs, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                       **options)
                    speeds.setdefault((prompt_name, decoding, threads), []).append(
                        args.new_tokens / (time.perf_counter() - start)
                    )
    print(f"load average {os.getloadavg()[0]:.1f}; tokens/s, median of {args.repeats}; ratio to {args.threads[0]} thread(s)")
    for prompt_name in PROMPTS:
        for decoding in DECODINGS:
            base = statistics.median(speeds[(prompt_name, decoding, args.threads[0])])
            cells = [
                f"{t} threads {statistics.median(speeds[(prompt_name, decoding, t)]):7.1f} "
                f"({statistics.median(speeds[(prompt_name, decoding, t)]) / base:.2f}x)"
                for t in args.threads
            ]
            print(f"{prompt_name:9s} {decoding:15s} " + "  ".join(cells))


if __name__ == "__main__":
    main()
