"""`wedlm-hf` command line: dispatch to one subcommand module, imported only when it is chosen.

This module sits outside the `wedlm_hf` package on purpose: importing the package registers the WeDLM classes with
transformers, which imports torch (seconds), and `wedlm-hf --help` or `--version` need none of that.
"""

import argparse
import difflib
import importlib
import os
import re
import sys
from importlib.metadata import PackageNotFoundError, version

SUBCOMMANDS = {  # name: (module, one-line help, the extra that installs its optional dependencies)
    "generate": (
        "wedlm_hf.commands.generate",
        "generate a continuation with WeDLM decoding and print its stats; batch jobs: generate --input rows.jsonl "
        "--output out.jsonl",
        None,
    ),
    "serve": ("wedlm_hf.commands.serve", "serve a model with `transformers serve` (OpenAI API), WeDLM decoding", "serve"),
    "bench": ("wedlm_hf.commands.bench", "benchmark WeDLM against AR, prompt lookup and the baselines", "bench"),
    "demo": ("wedlm_hf.commands.demo", "browser demo: WeDLM and AR side by side, with the step view", "demo"),
    "evaluate": (
        "wedlm_hf.commands.evaluate", "WeDLM vs greedy on held-out prompts, drift from a base model, HumanEval", "eval"
    ),
    "train": ("wedlm_hf.commands.train", "train the embedded WeDLM checkpoint from scratch on CPU", "train"),
    "finetune": ("wedlm_hf.commands.finetune", "adapt a causal LM (or a WeDLM checkpoint) to WeDLM decoding", "finetune"),
    "export": (
        "wedlm_hf.commands.export", "export a Hub-ready WeDLM folder, a custom_generate recipe or a demo Space", None
    ),
    "push": ("wedlm_hf.commands.push", "upload a folder written by `wedlm-hf export` to the Hub", None),
}


class UserError(Exception):
    """A problem the user can fix; printed as one line, without a traceback."""


class Parser(argparse.ArgumentParser):
    """argparse's parser, its errors raised as one line naming the option (no usage block, the exit status of every
    other user error)."""

    chosen: argparse.ArgumentParser | None = None
    """The chosen subcommand's parser (`build_parser` sets it), whose options a misspelt one is matched against."""

    def error(self, message: str):
        raise UserError(plain_message(message))


TYPE_NAMES = {"int": "an integer", "float": "a number"}


def plain_message(message: str) -> str:
    """argparse's message without its internal words: `argument --x: invalid int value: 'a'` -> `--x: expected an
    integer, got 'a'`."""
    message = re.sub(r"^argument ", "", message)
    return re.sub(
        r"invalid (\w+) value: (.*)$",
        lambda match: f"expected {TYPE_NAMES.get(match.group(1), 'a valid value')}, got {match.group(2)}",
        message,
    )


def refuse_extras(parser: "Parser", extras: list[str]) -> None:
    """A misspelt option is an error naming it (argparse would take the word after it as the prompt)."""
    option = next((word.split("=")[0] for word in extras if word.startswith("-") and word != "-"), None)
    if option is None:
        raise UserError(f"unexpected argument {extras[0]!r}")
    known = [name for action in (parser.chosen or parser)._actions for name in action.option_strings]
    near = difflib.get_close_matches(option, known, n=1)
    raise UserError(f"unknown option {option}" + (f" (did you mean {near[0]}?)" if near else ""))


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default, unless there is none to show (flags) or its help already states it ("default:",
    "(default 8)"): one default per option."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False) or re.search(r"default:|\(default ", action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _version() -> str:
    try:
        return version("wedlm-hf")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "unknown"


def chosen_command(argv: list[str]) -> str | None:
    return next((word for word in argv if word in SUBCOMMANDS), None)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The top-level parser; only the subcommand named in `argv` has its module imported and its options added."""
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback of an error"
    )
    parser = Parser(
        prog="wedlm-hf", description="WeDLM parallel decoding for Hugging Face transformers.", parents=[debug]
    )
    parser.add_argument("--version", action="version", version=f"wedlm-hf {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = chosen_command(argv)
    for name, (module_name, help_text, extra) in SUBCOMMANDS.items():
        subparser = subparsers.add_parser(
            name,
            help=help_text,
            description=help_text,
            parents=[debug],
            formatter_class=DefaultsHelpFormatter,
        )
        if name == chosen:
            _import_command(name, module_name, extra).register(subparser)
            parser.chosen = subparser
    return parser


def _import_command(name: str, module_name: str, extra: str | None):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if not error.name or error.name.split(".")[0] in ("wedlm_hf", "transformers", "torch"):
            raise
        install = f"pip install 'wedlm-hf[{extra}]'" if extra else f"pip install {error.name.split('.')[0]}"
        raise UserError(f"`wedlm-hf {name}` needs the package {error.name!r}: {install}") from error


USER_ERRORS = (UserError, ValueError, OSError, ImportError)
"""Bad values, missing files or packages, unreachable hosts: the message says what to fix, a traceback would only
hide it."""


def describe(error: BaseException) -> str:
    """One line for an error: its message with line breaks folded, a hint where the cause is the network, and
    the way to the traceback where the error is not a user error."""
    message = " ".join(str(error).split()) or type(error).__name__
    network = any(
        isinstance(e, (ConnectionError, TimeoutError)) or type(e).__module__.split(".")[0] in ("httpx", "httpcore")
        for e in _chain(error)
    )
    if network:
        endpoint = f" at {os.environ['HF_ENDPOINT']}" if os.environ.get("HF_ENDPOINT") else ""
        return f"cannot reach the Hugging Face Hub{endpoint} ({message}); check the network connection and HF_TOKEN"
    if isinstance(error, USER_ERRORS):
        return message
    return f"{type(error).__name__}: {message} (run with --debug for the traceback)"


def _chain(error: BaseException):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def main(argv: list[str] | None = None) -> int:
    """Run `wedlm-hf`; a failure prints one line to stderr and returns 1 (`--debug` raises it instead)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    try:
        parser = build_parser(argv)
        args, extras = parser.parse_known_args(argv)
        if extras:
            refuse_extras(parser, extras)
        if hasattr(args, "threads"):  # a command that runs a model: its threads are set before anything loads
            from wedlm_hf.commands.placement import apply_threads

            apply_threads(args)
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("wedlm-hf: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if debug:
            raise
        command = chosen_command(argv)
        prefix = f"wedlm-hf {command}" if command else "wedlm-hf"
        print(f"{prefix}: error: {describe(error)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
