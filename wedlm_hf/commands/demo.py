"""Serve the browser demo: WeDLM and autoregressive decoding side by side, with a step view of the window.

Gradio is imported only when the command runs, so `wedlm-hf` works on installs without the `demo` extra.
"""

import argparse
import sys

from ..loading.names import MODEL_HELP
from .placement import add_threads_argument


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default=None, help="preselected in the page: " + MODEL_HELP + " (default: the embedded checkpoint)"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="interface to bind (default: loopback only; 0.0.0.0 exposes it)"
    )
    parser.add_argument("--port", type=int, default=7860, help="port to listen on")
    parser.add_argument("--concurrency", type=int, default=1, help="generations served at once, each using two threads")
    parser.add_argument("--queue-size", type=int, default=16, help="requests allowed to wait for a free slot")
    add_threads_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        from ..demo.app import build_app, launch
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] != "gradio":
            raise
        print("The demo needs Gradio: pip install 'wedlm-hf[demo]'", file=sys.stderr)
        return 1
    if args.concurrency < 1 or args.queue_size < 1:
        raise ValueError("--concurrency and --queue-size must be at least 1")
    launch(build_app(args.model, args.concurrency, args.queue_size), args.host, args.port)
    return 0
