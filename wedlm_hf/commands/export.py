"""Export a Hub-ready WeDLM folder (remote code, config, weights, card), a `custom_generate` recipe, or the demo as
a Hugging Face Space."""

import argparse
from pathlib import Path

from ..loading.names import MODEL_HELP


def register(parser: argparse.ArgumentParser) -> None:
    from ..hub.export import HUB_CONFIG_NAMES

    parser.add_argument("directory", help="folder to write (new or empty, unless --overwrite)")
    parser.add_argument(
        "--overwrite", action="store_true",
        help="write into a folder that already holds files: those of the export's names are replaced, others kept",
    )
    parser.add_argument("--config", choices=HUB_CONFIG_NAMES, help="a shipped checkpoint config (no weights)")
    parser.add_argument(
        "--model",
        help="the model to export with its weights: a WeDLM model, or with --custom-generate a "
        "Llama/Mistral/Qwen2/Qwen3 model to pair with the recipe, or with --space the model the page preselects; "
        + MODEL_HELP,
    )
    parser.add_argument(
        "--custom-generate", action="store_true", help="write a custom_generate/ recipe for any supported model"
    )
    parser.add_argument(
        "--space",
        action="store_true",
        help="write the demo as a Hugging Face Space (README front matter, app.py, this package's wheel, "
        "requirements.txt); --model: a named model or Hub id (default: the embedded checkpoint)",
    )
    parser.add_argument("--repo-id", help="Hub repository the folder is meant for; the card's snippet loads from it")
    parser.add_argument("--base-model", help="Hub id recorded as base_model in the card (default: --model if a Hub id)")
    parser.add_argument(
        "--license", default="apache-2.0", help="license of the weights, a Hub license id (default: %(default)s)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..hub.export import export_custom_generate, export_model_folder
    from ..hub.space import export_space

    target = Path(args.directory)
    if target.is_dir() and any(target.iterdir()) and not args.overwrite:
        raise ValueError(f"{target} is not empty: pass --overwrite to write the export into it, or name a new folder")
    card = {"repo_id": args.repo_id, "base_model": args.base_model, "license": args.license}
    if args.space:
        _refuse_with_space(args)
        folder = export_space(args.directory, model=args.model, license=args.license)
    elif args.custom_generate:
        if args.config:
            raise ValueError("--config and --custom-generate cannot be combined: a recipe pairs with --model or none")
        folder = export_custom_generate(args.directory, model=args.model, **card)
    elif (args.config is None) == (args.model is None):
        raise ValueError("pass one of --config NAME, --model PATH_OR_ID or --custom-generate")
    else:
        folder = export_model_folder(args.directory, config_name=args.config, model=args.model, **card)
    print(f"wrote {folder}")
    return 0


def _refuse_with_space(args: argparse.Namespace) -> None:
    given = {
        "--config": args.config,
        "--custom-generate": args.custom_generate,
        "--repo-id": args.repo_id,
        "--base-model": args.base_model,
    }
    combined = [option for option, value in given.items() if value]
    if combined:
        raise ValueError(
            f"--space cannot be combined with {', '.join(combined)}: a Space folder takes --model and --license "
            "(`wedlm-hf push DIR --repo-id` names its repository)"
        )
