"""`wedlm-hf evaluate MODEL --prompts FILE`: WeDLM vs greedy per prompt domain, drift from a base model, HumanEval."""

import argparse
import sys

from ..loading.names import MODEL_HELP
from .placement import add_threads_argument


def _thresholds(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"comma-separated numbers, e.g. 0.2,0.4,0.8 ({error})") from error
    if not values:
        raise argparse.ArgumentTypeError("give at least one threshold, e.g. 0.4")
    return values


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", nargs="?", help=MODEL_HELP + " (default: the embedded checkpoint)"
    )
    parser.add_argument("--prompts", metavar="FILE", help='held-out prompts, JSONL: {"prompt": ..., "domain": ...} '
                        'or {"messages": [...], "domain": ...} per line')
    parser.add_argument("--base-model", metavar="M", help="measure greedy drift from this model (needs --chat-prompts)")
    parser.add_argument("--chat-prompts", metavar="FILE", help="general chat prompts for the drift check, same format")
    parser.add_argument("--thresholds", type=_thresholds, default=None,
                        help="plain WeDLM entropy thresholds, comma-separated (default: 0.2,0.4,0.8; --humaneval: 0.4)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: 64 (--humaneval: 256)")
    parser.add_argument("--repeats", type=int, default=3, help="timed interleaved repeats (the median is reported)")
    parser.add_argument("--humaneval", action="store_true", help="run HumanEval pass@1 instead (the `eval` extra)")
    parser.add_argument("--limit", type=int, help="--humaneval: the first N problems only (default: all 164)")
    parser.add_argument("--timeout", type=float, default=5.0, help="--humaneval: seconds per test run")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    add_threads_argument(parser)
    parser.add_argument("--json", metavar="OUT", help="also write the report as JSON")
    parser.set_defaults(run=run)


def check_options(args: argparse.Namespace) -> None:
    """Options that do not fit together are an error naming them, before any model loads."""
    if args.humaneval:
        given = [name for name in ("prompts", "base_model", "chat_prompts") if getattr(args, name)]
        if given:
            raise ValueError(f"--humaneval runs HumanEval's own prompts: drop --{given[0].replace('_', '-')}")
        return
    if args.limit is not None:
        raise ValueError("--limit applies to --humaneval only")
    if not args.prompts:
        raise ValueError("give --prompts FILE (JSONL of held-out prompts), or --humaneval")
    if bool(args.base_model) != bool(args.chat_prompts):
        raise ValueError("the drift check needs both --base-model and --chat-prompts")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {args.repeats}")


def run(args: argparse.Namespace) -> int:
    check_options(args)
    from transformers.utils import logging

    from ..evaluation.evaluate import DEFAULT_THRESHOLDS, evaluate_model
    from ..evaluation.prompts import read_prompts
    from ..loading import load_model_and_tokenizer

    prompts = None if args.humaneval else read_prompts(args.prompts)  # a bad file fails before the model loads
    chat_prompts = read_prompts(args.chat_prompts) if args.chat_prompts else None
    logging.disable_progress_bar()
    model, tokenizer = load_model_and_tokenizer(args.model, dtype=args.dtype)
    if args.humaneval:
        from ..evaluation.humaneval import run_humaneval

        report = run_humaneval(
            model, tokenizer, limit=args.limit, thresholds=args.thresholds or (0.4,),
            max_new_tokens=args.max_new_tokens or 256, timeout=args.timeout,
        )
    else:
        base_model, base_tokenizer = load_model_and_tokenizer(args.base_model, dtype=args.dtype) if args.base_model else (None, None)
        report = evaluate_model(
            model, tokenizer, prompts, base_model=base_model, base_tokenizer=base_tokenizer, chat_prompts=chat_prompts,
            thresholds=args.thresholds or DEFAULT_THRESHOLDS, max_new_tokens=args.max_new_tokens or 64,
            repeats=args.repeats,
        )
    sys.stdout.write(report.markdown())
    if args.json:
        report.write_json(args.json)
    return 0
