"""Serve a model through `transformers serve` (OpenAI-compatible HTTP API) with WeDLM decoding."""

import argparse
import logging
import os
import sys

from wedlm_hf.generation.options import SERVE

from ..loading.names import DEFAULT_NAME, MODEL_HELP
from .options import add_wedlm_arguments, wedlm_keywords
from .placement import add_threads_argument, resolve_device


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", help=MODEL_HELP + " (default: the embedded checkpoint)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0 exposes the server)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument(
        "--api-key", default=None,
        help="the key clients must send (`Authorization: Bearer KEY`, an OpenAI client's api_key); others get HTTP "
        "401. Default: the WEDLM_API_KEY environment variable, which other users of the machine cannot read from "
        "the process list",
    )
    parser.add_argument("--device", default="auto", help="device map, e.g. auto, cpu, cuda:0")
    add_threads_argument(parser)
    parser.add_argument("--dtype", default="auto", help="'auto': the checkpoint's")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    batching = parser.add_argument_group("continuous batching (docs/serving.md)")
    batching.add_argument(
        "--continuous-batching", action="store_true",
        help="decode concurrent requests together: requests join the running batch at step boundaries",
    )
    batching.add_argument("--max-batch-size", type=int, default=8, help="most requests decoded at once")
    batching.add_argument(
        "--max-batch-tokens", type=int, default=None,
        help="most prompt + max_tokens tokens summed over the batch (default: no bound but the batch size)",
    )
    batching.add_argument(
        "--draft-history", type=int, default=None, metavar="TOKENS",
        help="with --lossless: also draft from the last TOKENS tokens of earlier requests' prompts and outputs "
        "(repetitive workloads)",
    )
    wedlm = parser.add_argument_group("WeDLM parameters (set on the model's generation config, for every request)")
    add_wedlm_arguments(wedlm, wedlm.add_mutually_exclusive_group(), also=SERVE)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from wedlm_hf.loading import pretrained_path
    from wedlm_hf.serving import serve
    from wedlm_hf.serving.auth import API_KEY_VARIABLE, is_loopback

    defaults = wedlm_keywords(args)  # an option not given is left to the model's generation config
    if args.draft_history is not None and not args.continuous_batching:
        raise ValueError("--draft-history drafts from the requests continuous batching answered: add --continuous-batching")
    if args.draft_history is not None and defaults.get("wedlm_lossless") is not True:
        raise ValueError("--draft-history drafts for lossless decoding to verify: add --lossless")
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_VARIABLE)
    if api_key is None and not is_loopback(args.host):
        print(
            f"wedlm-hf serve: warning: {args.host} is reachable from other machines and no API key is set: anyone "
            f"who reaches port {args.port} can use the server (set {API_KEY_VARIABLE} or --api-key)",
            file=sys.stderr,
        )
    log = logging.getLogger("wedlm_hf.serving")  # e.g. the end user a request names, at --log-level info
    log.setLevel(args.log_level.upper())
    if not log.handlers:
        log.addHandler(logging.StreamHandler())
    if args.device != "auto":
        resolve_device(args.device)  # a device this machine lacks is one line now, not a traceback per request
    serve(
        pretrained_path(args.model),
        name=args.model or DEFAULT_NAME,  # clients send the name the user gave, not the folder it stands for
        host=args.host,
        port=args.port,
        api_key=api_key,
        announce=lambda: print(f"serving on http://{args.host}:{args.port}/v1 (OpenAI API); Ctrl-C stops", flush=True),
        generation_defaults=defaults,
        batching=(
            {"max_batch_size": args.max_batch_size, "max_batch_tokens": args.max_batch_tokens,
             "draft_history": args.draft_history}
            if args.continuous_batching else None
        ),
        device=args.device,
        dtype=args.dtype,
        log_level=args.log_level,
    )
    return 0
