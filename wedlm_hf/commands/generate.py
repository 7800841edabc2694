"""Generate a continuation with WeDLM decoding (default: the embedded checkpoint) and print its statistics."""

import argparse
import time

import torch

from .generate_batch import add_batch_arguments, run_batch, uses_batch_mode


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", nargs="?", help="text to continue (or --input for a file of rows)")
    parser.add_argument("--model", default=None, help="local path or Hub id (default: the embedded checkpoint)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--ar", action="store_true", help="plain greedy autoregressive decoding instead of WeDLM")
    parser.add_argument("--window-size", type=int, default=None)
    parser.add_argument("--threshold", type=float, default=None, help="entropy threshold")
    parser.add_argument("--penalty", type=float, default=None, help="position penalty factor")
    parser.add_argument("--mask-token-id", type=int, default=None, help="for models whose config names none")
    add_batch_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if uses_batch_mode(args):
        return run_batch(args)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    import wedlm_hf

    logging.disable_progress_bar()  # keep stdout to the continuation and the stats line

    path = args.model or wedlm_hf.DEFAULT_MODEL
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = wedlm_hf.enable(AutoModelForCausalLM.from_pretrained(path).eval())
    inputs = tokenizer(args.prompt, return_tensors="pt")
    options = {"max_new_tokens": args.max_new_tokens, "do_sample": False, "return_dict_in_generate": True}
    if args.ar:
        options["decoding"] = "ar"
    else:
        options["decoding"] = "wedlm"
        for key, value in (
            ("wedlm_window_size", args.window_size),
            ("wedlm_entropy_threshold", args.threshold),
            ("wedlm_pos_penalty_factor", args.penalty),
            ("mask_token_id", args.mask_token_id),
        ):
            if value is not None:
                options[key] = value
    start = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(**inputs, **options)
    seconds = time.perf_counter() - start
    new_tokens = output.sequences[0, inputs["input_ids"].shape[1] :]
    print(tokenizer.decode(new_tokens, skip_special_tokens=True))
    stats = getattr(output, "wedlm_stats", None)
    count = len(new_tokens)
    if stats is None:
        print(f"[ar] tokens={count} forwards={count} tokens/forward=1.00 tokens/s={count / seconds:.1f}")
    else:
        summary = stats.summary()
        print(
            f"[wedlm] tokens={summary['generated']} forwards={summary['forwards']} "
            f"tokens/forward={summary['tokens_per_forward']:.2f} p_cache={summary['p_cache']:.3f} "
            f"tokens/s={summary['generated'] / seconds:.1f}"
        )
    return 0
