"""The WeDLM options on the command line, derived from `wedlm_hf/generation/options.py`: one flag per option (a
bool option also gets the flag that turns it off), checked as `generate` checks it, read back as `generate`
keywords. `add_written_arguments` adds the flags of the options `finetune` and `train` write into their output's
generation config, `add_field_arguments` the flags of their own options dataclass."""

import argparse
import json
import typing
from dataclasses import fields, replace
from pathlib import Path

import wedlm_hf
from wedlm_hf.generation.options import CLI, FINETUNE, WeDLMOption, exposed_to


def _checkpoint_default(keyword: str):
    config = json.loads((Path(wedlm_hf.DEFAULT_MODEL) / "generation_config.json").read_text())
    return config.get(keyword)


def default_help(option: WeDLMOption) -> str:
    """Where the value comes from when the flag is absent; a source that sets nothing is left unsaid."""
    embedded = _checkpoint_default(option.keyword)
    text = "default: the model's generation config"
    if embedded is not None:
        text += f" (embedded checkpoint: {embedded})"
    if option.default is not None:
        text += f", else the library default {option.default}"
    return text


def value_parser(option: WeDLMOption, none_allowed: bool = True):
    """argparse's `type` for `option`: its value, of its kind and within its bounds (so the error names the flag the
    user typed), or an error saying what it must be. `none_allowed` False: a value written into a generation
    config, where an absent flag already means the default."""
    accepts = option.accepts if none_allowed else replace(option.accepts, none_means=None)

    def parse(text: str) -> object:
        try:
            value = accepts.parse(text)
        except ValueError:
            value = text
        if not accepts(value):
            raise argparse.ArgumentTypeError(f"must be {accepts.describe('cli')}; got {text!r}")
        return value

    parse.__name__ = option.setting
    return parse


def add_wedlm_arguments(
    group: argparse._ArgumentGroup, mode: argparse._MutuallyExclusiveGroup, also: str | None = None
) -> None:
    """Add the flags of the options exposed to the command line (and to `also`, e.g. `SERVE`): a bool option with an
    off flag chooses the decoding mode, so both its flags go in the mutually exclusive `mode` group; the others in
    `group`. Each sets its `generate` keyword as dest, absent from
    the namespace unless the flag is given (so the model's generation config decides)."""
    for option in exposed_to(CLI):
        if also is not None and also not in option.exposed:
            continue
        if option.accepts.kind == "bool" and option.flag_off is None:
            group.add_argument(
                option.flag, dest=option.keyword, action="store_const", const=True, default=argparse.SUPPRESS,
                help=option.help,
            )
        elif option.accepts.kind == "bool":
            mode.add_argument(
                option.flag, dest=option.keyword, action="store_const", const=True, default=argparse.SUPPRESS,
                help=option.help,
            )
            mode.add_argument(
                option.flag_off, dest=option.keyword, action="store_const", const=False, default=argparse.SUPPRESS,
                help=f"turn {option.flag} off, also where the model's generation config turns it on",
            )
        else:
            none = f" ('none': {option.accepts.none_means})" if option.accepts.none_means else ""
            group.add_argument(
                option.flag, *option.old_flags, dest=option.keyword, metavar=option.setting.upper(),
                type=value_parser(option), default=argparse.SUPPRESS,
                help=f"{option.help}{none}; {default_help(option)}",
            )


def wedlm_keywords(args: argparse.Namespace) -> dict:
    """The `generate` keywords of the WeDLM options given on the command line."""
    given = (option.keyword for option in exposed_to(CLI) if hasattr(args, option.keyword))
    return {keyword: getattr(args, keyword) for keyword in given}


def given_flags(args: argparse.Namespace) -> list[str]:
    """The flags of the WeDLM options given on the command line, for error messages."""
    return [option.flag for option in exposed_to(CLI) if hasattr(args, option.keyword)]


CHOSEN_BY_EVALUATION = "entropy_threshold"
"""The written option whose absence lets the end-of-run evaluation choose it (plain WeDLM's threshold)."""


def add_written_arguments(parser: argparse.ArgumentParser, where: str) -> None:
    """Flags of the options written into `where` (a trained model's generation config; `FINETUNE` in the table),
    with the settings as dests. `--lossless` / `--plain` are exclusive and default to None: the end-of-run
    evaluation chooses, as it chooses the entropy threshold when none is given."""
    for option in exposed_to(FINETUNE):
        if option.flag_off is not None:
            mode = parser.add_mutually_exclusive_group()
            mode.add_argument(
                option.flag, dest=option.setting, action="store_const", const=True, default=None,
                help=f"{option.help}, as the default decoding written to {where} (default: the end-of-run "
                "evaluation chooses)",
            )
            mode.add_argument(
                option.flag_off, dest=option.setting, action="store_const", const=False,
                help=f"plain WeDLM (commits the model's own mask predictions), as the default decoding written to {where}",
            )
            continue
        chosen = option.setting == CHOSEN_BY_EVALUATION
        default = f"the evaluation's choice, else {option.default}" if chosen else option.default
        parser.add_argument(
            option.flag, *option.old_flags, dest=option.setting, metavar=option.setting.upper(),
            type=value_parser(option, none_allowed=False), default=None if chosen else option.default,
            help=f"{option.help}; written to {where} (default: {default})",
        )


def add_field_arguments(parser: argparse.ArgumentParser, options: type, help: dict[str, str]) -> None:
    """A flag per field of the dataclass `options` named in `help` (`--field-name`, the field's default and type;
    a bool field is a switch), so a recipe's options are declared once, in its dataclass."""
    defaults = options()
    for field in fields(options):
        if field.name not in help:
            continue
        flag, default = "--" + field.name.replace("_", "-"), getattr(defaults, field.name)
        if isinstance(default, bool):
            parser.add_argument(flag, action="store_true", help=help[field.name])
            continue
        kind = next(t for t in typing.get_args(field.type) or (field.type,) if t is not type(None))
        parser.add_argument(flag, type=kind, default=default, help=help[field.name])


def field_values(args: argparse.Namespace, options: type, exclude: tuple[str, ...] = ()) -> dict:
    """The values of `options`' fields that the command line set (all but `exclude`)."""
    return {field.name: getattr(args, field.name) for field in fields(options) if field.name not in exclude}
