"""The WeDLM options, declared once: the `generate` keywords (also `GenerationConfig` attributes), their defaults,
what a value must be, and which front ends expose them.

`WeDLMSettings.resolve`, the command line, `serve`, batch rows and the demo all read this table, so an option is
added (or renamed) here and nowhere else.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class WeDLMOption:
    keyword: str
    """The `generate` keyword, and the generation config attribute read when the call does not pass it."""
    setting: str
    """The `WeDLMSettings` field it resolves to."""
    default: object
    accepts: str
    """What a value must be, in the words error messages and batch rows use."""
    cli: str | None = None
    """The command-line option name (`--<cli>`), if the command line takes it."""
    in_rows: bool = False
    """Whether a batch row may override it."""
    in_serve: bool = False
    """Whether `serve` may set it for every request."""


OPTIONS = (
    WeDLMOption(
        "wedlm_window_size", "window_size", 16, "an integer >= 1", cli="window_size", in_rows=True, in_serve=True
    ),
    WeDLMOption(
        "wedlm_entropy_threshold", "entropy_threshold", 0.4, "a number >= 0 or null", cli="threshold", in_rows=True,
        in_serve=True,
    ),
    WeDLMOption(
        "wedlm_pos_penalty_factor", "pos_penalty_factor", 0.02, "a number >= 0", cli="penalty", in_rows=True,
        in_serve=True,
    ),
    WeDLMOption("mask_token_id", "mask_token_id", None, "an integer id", cli="mask_token_id", in_serve=True),
    WeDLMOption("wedlm_blockwise", "blockwise", False, "true or false", in_rows=True),
    WeDLMOption("wedlm_lossless", "lossless", False, "true or false", in_rows=True, in_serve=True),
    WeDLMOption("wedlm_draft_schedule", "draft_schedule", "adaptive", "'adaptive' or 'full'"),
    WeDLMOption("wedlm_prompt_lookup", "prompt_lookup", False, "true or false", in_rows=True, in_serve=True),
    WeDLMOption("wedlm_prompt_lookup_ngram", "prompt_lookup_ngram", 2, "an integer >= 1", in_rows=True),
    WeDLMOption("wedlm_prompt_lookup_tokens", "prompt_lookup_tokens", 10, "an integer >= 1", in_rows=True),
    WeDLMOption("wedlm_static", "static", False, "true or false"),
)

BY_SETTING = {option.setting: option for option in OPTIONS}
KEYWORDS = tuple(option.keyword for option in OPTIONS)
