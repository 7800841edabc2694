"""Benchmark WeDLM against greedy AR, prompt lookup, block-wise WeDLM, lossless WeDLM with each draft source
(mask slots, prompt lookup, the engine's history of earlier requests) and the cache-free reference; with
`--compile`, also compiled AR on transformers' static cache against WeDLM's compiled static-shape path.

Prints a markdown table (tokens/s, forwards, tokens/forward, p_cache, peak RSS, agreement with AR) per prompt set,
the time-vs-length table and the forward cost model (a profile measured before the arms, beside the scale the
decoder prices with and the declared one; `--store-forward-cost` makes the decoder use it); optionally writes JSON
and a PNG.
"""

import argparse
import importlib.util
import sys

from ..loading.names import MODEL_HELP
from .placement import add_threads_argument

FULL = {
    "num_prompts": 8, "max_new_tokens": 128, "repeats": 3, "thresholds": "0.1,0.2,0.4,0.8,1.6", "lengths": "64,128,256,512,1024"
}
QUICK = {
    "num_prompts": 4, "max_new_tokens": 64, "repeats": 2, "thresholds": "0.2,0.8", "lengths": "64,128,256,512",
    "plot": "bench_quick.png", "json": "bench_quick.json",
}
"""Sizes of a full run and of `--quick`, and where `--quick` writes its chart and numbers (the names of the README's
chart and its numbers in docs/); an option given on the command line overrides either."""


def _thresholds(text: str) -> tuple[float | None, ...]:
    """A comma-separated sweep of `wedlm_entropy_threshold` values ('none' or '1slot': one slot per step)."""
    from wedlm_hf.generation.options import BY_SETTING

    parse = BY_SETTING["entropy_threshold"].accepts.parse
    return tuple(None if t.strip().lower() == "1slot" else parse(t) for t in text.split(",") if t.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in text.split(",") if t.strip())


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help=MODEL_HELP + " (default: the embedded checkpoint; 'random': a random 4-layer d=256 model with random "
        "prompts)",
    )
    parser.add_argument(
        "--prompts",
        action="append",
        default=None,
        help="'code', 'counting', 'grounded' (requests to edit a quoted held-out function), 'repeated' (code "
        "prompts the history arms answered before, each now with a small edit) or a JSONL file of "
        "{\"prompt\": ...}; repeatable (default: code, counting, grounded)",
    )
    parser.add_argument("--num-prompts", type=int, help=f"prompts per set (default {FULL['num_prompts']})")
    parser.add_argument("--max-new-tokens", type=int, help=f"default {FULL['max_new_tokens']}")
    parser.add_argument(
        "--repeats", type=int, help=f"timed interleaved repeats, median reported (default {FULL['repeats']})"
    )
    parser.add_argument("--thresholds", help="entropy thresholds swept for wedlm and wedlm_blockwise; 'none' = one "
                        f"slot per step (default {FULL['thresholds']})")
    parser.add_argument("--arms", default=None, help="comma-separated arm families (default: all)")
    parser.add_argument(
        "--lengths", help=f"generated lengths of the time-vs-length run ('' skips it; default {FULL['lengths']})"
    )
    add_threads_argument(parser)
    parser.add_argument(
        "--quick", action="store_true",
        help="small sizes (4 prompts, 64 tokens, 2 repeats) for the options not given, a few minutes; writes the "
        f"chart to {QUICK['plot']} and the numbers to {QUICK['json']} in the current folder unless --plot/--json say "
        "where",
    )
    parser.add_argument(
        "--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
        help="also run ar_compiled (transformers' static cache + torch.compile) and wedlm_compiled (WeDLM's "
        "static-shape path, compiled the same way); BACKEND defaults to inductor, 'eager' checks the wiring quickly",
    )
    parser.add_argument("--json", default=None, metavar="PATH", help="write all results as JSON (default: none; "
                        f"--quick: {QUICK['json']})")
    parser.add_argument("--plot", default=None, metavar="PATH", help="write the two figures as PNG (default: none; "
                        f"--quick: {QUICK['plot']})")
    parser.add_argument(
        "--store-forward-cost", action="store_true",
        help="store this run's forward cost profile (about a second of forwards, measured before the arms) for this "
        "device and model, so that its arms and later calls price lossless mode's draft widths with it "
        "(`wedlm_forward_scale='auto'`); without it the profile is only printed beside the scale the decoder uses",
    )
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(run=run)


def apply_sizes(args: argparse.Namespace) -> None:
    """Fill in the options not given on the command line: `--quick`'s, else a full run's."""
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def run(args: argparse.Namespace) -> int:
    from ..bench.measure import measured_cost_info
    from ..bench.models import load_model
    from ..bench.prompts import PROMPT_SETS, load_prompt_set, primed_prompts
    from ..bench.report import markdown, plot, write_json
    from ..bench.runner import BenchConfig, run_bench
    from ..cost_profiles.store import profile_key, store_profile
    from ..generation.cost_profile import measure_profile

    apply_sizes(args)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise SystemExit("--plot needs matplotlib: pip install 'wedlm-hf[bench]'")  # fail before, not after, the run
    config = BenchConfig(  # bad arms fail here, before the model loads
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        thresholds=_thresholds(args.thresholds),
        families=tuple(a.strip() for a in args.arms.split(",")) if args.arms else None,
        scaling_lengths=_ints(args.lengths),
        compile_backend=args.compile,
    )
    model, tokenizer = load_model(args.model)
    vocab_size = model.config.get_text_config().vocab_size
    names = args.prompts or list(PROMPT_SETS)
    if tokenizer is None:
        names = ["random"]
    prompt_sets = {name: load_prompt_set(name, args.num_prompts, tokenizer, vocab_size) for name in names}
    primed = {name: primed_prompts(name, args.num_prompts, tokenizer) for name in names}
    profile = measure_profile(model)
    if args.store_forward_cost:
        store_profile(profile_key(model), profile)
    result = run_bench(model, prompt_sets, config, progress=not args.no_progress, primed=primed)
    result.forward_cost |= measured_cost_info(profile)
    sys.stdout.write(markdown(result))
    if args.json:
        write_json(result, args.json)
    if args.plot:
        plot(result, args.plot)
    return 0
