"""Export a Hub-ready WeDLM folder (remote code, config, weights, card) or a `custom_generate` recipe."""

import argparse


def register(parser: argparse.ArgumentParser) -> None:
    from .export import HUB_CONFIG_NAMES

    parser.add_argument("directory", help="folder to write")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", choices=HUB_CONFIG_NAMES, help="a shipped checkpoint config (no weights)")
    source.add_argument("--model", help="local path or Hub id of a WeDLM model to export with its weights")
    source.add_argument(
        "--custom-generate", action="store_true", help="write a custom_generate/ recipe for any supported model"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from .export import export_custom_generate, export_model_folder

    if args.custom_generate:
        folder = export_custom_generate(args.directory)
    else:
        folder = export_model_folder(args.directory, config_name=args.config, model=args.model)
    print(f"wrote {folder}")
    return 0
