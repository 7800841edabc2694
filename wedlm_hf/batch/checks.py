"""Every row's generation settings checked before the first batch runs, so a bad one stops the job unwritten.

Rows sharing a set of overrides share one check (transformers' `GenerationConfig.validate(strict=True)`, which
also refuses sampling flags without `do_sample`, and `WeDLMSettings.resolve`); the error names the first row
that uses the bad set.
"""

import copy

from transformers import PreTrainedModel

from ..generation import WeDLMSettings
from ..generation.options import BY_KEYWORD
from ..generation.validation import position_limit_error
from .plan import group_key
from .rows import PromptRow, RowError


def check_generation_settings(
    model: PreTrainedModel, rows: list[PromptRow], token_ids: list[list[int]], generate_kwargs: dict
) -> dict[str, int]:
    """Raise `RowError` for the first row whose settings or length cannot work; return max_new_tokens per group."""
    new_tokens: dict[str, int] = {}
    for row in rows:
        key = group_key(row.overrides)
        if key not in new_tokens:
            new_tokens[key] = _check_group(model, row, {**generate_kwargs, **row.overrides})
    for row, ids in zip(rows, token_ids):
        problem = position_limit_error(model, len(ids), new_tokens[group_key(row.overrides)])
        if problem is not None:
            raise RowError(f"{row.where}: {problem}")
    return new_tokens


def _check_group(model: PreTrainedModel, row: PromptRow, kwargs: dict) -> int:
    config = copy.deepcopy(model.generation_config)
    wedlm = {key: value for key, value in kwargs.items() if key in BY_KEYWORD or key.startswith("wedlm_")}
    plain = {key: value for key, value in kwargs.items() if key not in wedlm and key not in ("decoding", "tokenizer")}
    decoding = kwargs.get("decoding", getattr(config, "decoding", None))
    try:
        config.update(**plain)
        config.validate(strict=True)
        if decoding == "wedlm":
            WeDLMSettings.resolve(config, model.config, model.config.get_text_config().vocab_size, **wedlm)
        elif wedlm:
            raise ValueError(f"{', '.join(wedlm)} need WeDLM decoding, but this run decodes autoregressively (--ar).")
    except (ValueError, TypeError) as error:  # transformers' message spans lines: keep the ones naming the flag
        lines = [line.strip(" -") for line in str(error).splitlines() if line.strip() and "pretrained model" not in line]
        raise RowError(f"{row.where}: {' '.join(lines)}") from None
    if config.max_new_tokens is None:
        raise RowError(f"{row.where}: set `max_new_tokens` (for every row, or on this one).")
    return config.max_new_tokens
