"""WeDLM decoding parameters: where they come from and what values are legal.

A value is taken from the `generate` keyword, else from the `GenerationConfig` attribute of the same name (so a
checkpoint's generation_config.json can set them), else from the model config (`mask_token_id`), else the default.
One exception: lossless mode ignores a generation config's entropy threshold (tuned for committing) and drafts
every mask, unless the threshold is passed to `generate`. Each value is checked by its `options.py` entry.
"""

import math
from dataclasses import dataclass
from numbers import Integral

from transformers import GenerationConfig, PreTrainedConfig
from transformers.utils import logging

from .forward_cost import ForwardCost
from .options import BY_KEYWORD, BY_SETTING, OPTIONS

logger = logging.get_logger(__name__)

UNSET = object()
"""Marks a keyword the caller did not pass (`None` is a legal threshold, meaning one slot per step)."""

DEFAULT_WINDOW_SIZE = BY_SETTING["window_size"].default
DEFAULT_ENTROPY_THRESHOLD = BY_SETTING["entropy_threshold"].default
DEFAULT_POS_PENALTY_FACTOR = BY_SETTING["pos_penalty_factor"].default


@dataclass(frozen=True)
class WeDLMSettings:
    window_size: int
    entropy_threshold: float | None
    pos_penalty_factor: float
    mask_token_id: int
    blockwise: bool = False
    lossless: bool = False
    draft_schedule: str = "adaptive"
    forward_scale: float | str | ForwardCost | None = None
    """`wedlm_forward_scale` as given (a number, "auto", "measure" or "declared"), replaced by the cost model it
    chooses for the model's device (`cost_profile.chosen_cost`) once `prepare_decoding` has read it; see `cost`."""
    prompt_lookup: bool = False
    """Lossless mode also drafts from the context (`lookup.py`), `prompt_lookup_tokens` after a match of the last
    `prompt_lookup_ngram` tokens, `prompt_lookup_matches` matches at once where a tree verifies them (`tree.py`)."""
    prompt_lookup_ngram: int = BY_SETTING["prompt_lookup_ngram"].default
    prompt_lookup_min_ngram: int | None = BY_SETTING["prompt_lookup_min_ngram"].default
    """The shortest match that drafts; None: the device's (`lookup.SHORTEST_MATCH`)."""
    prompt_lookup_tokens: int = BY_SETTING["prompt_lookup_tokens"].default
    prompt_lookup_matches: int = BY_SETTING["prompt_lookup_matches"].default
    static: bool = False
    """Fixed-shape steps over a preallocated cache (generation/pool.py), for torch.compile / CUDA graphs."""

    @classmethod
    def resolve(
        cls, generation_config: GenerationConfig, model_config: PreTrainedConfig, vocab_size: int, **passed
    ) -> "WeDLMSettings":
        """The settings of one call; `passed` holds the `generate` keywords of `options.py` (`UNSET` = not passed)."""
        unknown = set(passed) - set(BY_KEYWORD)
        if unknown:
            raise TypeError(f"not WeDLM options: {sorted(unknown)}; the options are {', '.join(BY_KEYWORD)}.")
        passed = {keyword: value for keyword, value in passed.items() if value is not UNSET}
        if passed.get("wedlm_lossless", getattr(generation_config, "wedlm_lossless", False)) is True:
            # verification makes a wrong draft cost only its slot, so lossless mode drafts every mask unless the
            # caller asks otherwise (a checkpoint's threshold is tuned for committing, not for drafting)
            passed.setdefault("wedlm_entropy_threshold", math.inf)
        # `cache_implementation="static"`, transformers' switch for compiled AR decoding, selects the same for WeDLM
        static = getattr(generation_config, "cache_implementation", None) == "static"
        values = {}
        for option in OPTIONS:
            default = static if option.setting == "static" else option.default
            value = passed.get(option.keyword, getattr(generation_config, option.keyword, default))
            if option.setting == "mask_token_id" and value is None:
                value = getattr(model_config, "mask_token_id", None)
                if value is None:
                    raise ValueError(
                        "WeDLM decoding needs a mask token: pass `mask_token_id=` to generate, or set `mask_token_id` "
                        "on the model config or its generation config."
                    )
            values[option.setting] = option.checked(value)
        mask_token_id = values["mask_token_id"]
        if not isinstance(mask_token_id, Integral) or mask_token_id >= vocab_size:
            raise ValueError(
                f"`mask_token_id` must be an integer id inside the vocabulary [0, {vocab_size}), got {mask_token_id!r}."
            )
        if not values["static"] and getattr(generation_config, "compile_config", None) is not None:
            logger.warning(
                "`compile_config` is used by WeDLM's static-shape path only; pass cache_implementation='static' (or "
                "wedlm_static=True) to compile the step."
            )
        if values["blockwise"] and values["lossless"]:
            raise ValueError("`wedlm_blockwise` and `wedlm_lossless` cannot be combined; choose one.")
        if "wedlm_draft_schedule" in passed and not values["lossless"]:
            raise ValueError(
                "`wedlm_draft_schedule` sets how lossless mode drafts; pass `wedlm_lossless=True` with it, or drop it."
            )
        sizes = ("ngram", "min_ngram", "tokens", "matches")
        sizes_passed = [name for name in sizes if f"wedlm_prompt_lookup_{name}" in passed]
        if values["prompt_lookup"] and not values["lossless"]:
            raise ValueError(
                "`wedlm_prompt_lookup=True` drafts from the context for lossless mode to verify; pass "
                "`wedlm_lossless=True` with it, or drop it."
            )
        if sizes_passed and not values["prompt_lookup"]:
            raise ValueError(
                f"`wedlm_prompt_lookup_{sizes_passed[0]}` sizes prompt lookup; pass `wedlm_prompt_lookup=True` "
                "(and `wedlm_lossless=True`) with it, or drop it."
            )
        shortest, longest = values["prompt_lookup_min_ngram"], values["prompt_lookup_ngram"]
        if shortest is not None and shortest > longest:
            raise ValueError(
                f"`wedlm_prompt_lookup_min_ngram={shortest}` is longer than `wedlm_prompt_lookup_ngram={longest}`, the "
                "longest n-gram matched; pass at most that, or raise `wedlm_prompt_lookup_ngram`."
            )
        threshold = values["entropy_threshold"]
        return cls(
            **values
            | {
                "window_size": int(values["window_size"]),
                "entropy_threshold": None if threshold is None else float(threshold),
                "pos_penalty_factor": float(values["pos_penalty_factor"]),
                "mask_token_id": int(mask_token_id),
            }
        )

    def cost(self, device_type: str) -> ForwardCost:
        """The cost model this call prices with: the one chosen for it, else (settings built without a model) the
        device type's declared model with the scale given, if a number was."""
        if isinstance(self.forward_scale, ForwardCost):
            return self.forward_scale
        given = None if isinstance(self.forward_scale, str) else self.forward_scale
        return ForwardCost.declared(device_type, given)
