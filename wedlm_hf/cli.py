"""`wedlm-hf` command line: each subcommand lives in its own module and registers itself here."""

import argparse
import importlib

SUBCOMMANDS = {
    "generate": "wedlm_hf.commands.generate",
    "train": "wedlm_hf.training.command",
    "bench": "wedlm_hf.bench.command",
    "export": "wedlm_hf.hub.export_command",
    "push": "wedlm_hf.hub.push_command",
    "demo": "wedlm_hf.demo.command",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wedlm-hf", description="WeDLM parallel decoding for transformers.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, module_name in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if not error.name or not module_name.startswith(error.name):
                raise
            continue  # subcommand not built into this install
        module.register(subparsers.add_parser(name, help=module.__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
