"""WeDLM decoding parameters: where they come from and what values are legal.

A value is taken from the `generate` keyword, else from the `GenerationConfig` attribute of the same name (so a
checkpoint's generation_config.json can set them), else from the model config (`mask_token_id`), else the default.
One exception: lossless mode ignores a generation config's entropy threshold (tuned for committing) and drafts
every mask, unless the threshold is passed to `generate`.
"""

import math
from dataclasses import dataclass
from numbers import Integral, Real

from transformers import GenerationConfig, PreTrainedConfig
from transformers.utils import logging

from .options import BY_SETTING

logger = logging.get_logger(__name__)

UNSET = object()
"""Marks a keyword the caller did not pass (`None` is a legal threshold, meaning one slot per step)."""

DEFAULT_WINDOW_SIZE = BY_SETTING["window_size"].default
DEFAULT_ENTROPY_THRESHOLD = BY_SETTING["entropy_threshold"].default
DEFAULT_POS_PENALTY_FACTOR = BY_SETTING["pos_penalty_factor"].default
DRAFT_SCHEDULES = ("adaptive", "full")
"""Lossless mode's drafts per forward: follow recent acceptance, or every slot of the window (see `lossless.py`)."""


@dataclass(frozen=True)
class WeDLMSettings:
    window_size: int
    entropy_threshold: float | None
    pos_penalty_factor: float
    mask_token_id: int
    blockwise: bool = False
    lossless: bool = False
    draft_schedule: str = "adaptive"
    prompt_lookup: bool = False
    """Lossless mode also drafts from the context (`lookup.py`), `prompt_lookup_tokens` after a match of the last
    `prompt_lookup_ngram` tokens."""
    prompt_lookup_ngram: int = BY_SETTING["prompt_lookup_ngram"].default
    prompt_lookup_tokens: int = BY_SETTING["prompt_lookup_tokens"].default
    static: bool = False
    """Fixed-shape steps over a preallocated cache (generation/static.py), for torch.compile / CUDA graphs."""

    @classmethod
    def resolve(
        cls,
        generation_config: GenerationConfig,
        model_config: PreTrainedConfig,
        vocab_size: int,
        window_size=UNSET,
        entropy_threshold=UNSET,
        pos_penalty_factor=UNSET,
        mask_token_id=UNSET,
        blockwise=UNSET,
        lossless=UNSET,
        draft_schedule=UNSET,
        static=UNSET,
        prompt_lookup=UNSET,
        prompt_lookup_ngram=UNSET,
        prompt_lookup_tokens=UNSET,
    ) -> "WeDLMSettings":
        def pick(value, setting: str, default=UNSET):
            if value is not UNSET:
                return value
            option = BY_SETTING[setting]
            return getattr(generation_config, option.keyword, option.default if default is UNSET else default)

        window_size = pick(window_size, "window_size")
        lossless = pick(lossless, "lossless")
        if lossless is True and entropy_threshold is UNSET:
            # verification makes a wrong draft cost only its slot, so lossless mode drafts every mask unless the
            # caller asks otherwise (a checkpoint's threshold is tuned for committing, not for drafting)
            entropy_threshold = math.inf
        entropy_threshold = pick(entropy_threshold, "entropy_threshold")
        pos_penalty_factor = pick(pos_penalty_factor, "pos_penalty_factor")
        mask_token_id = pick(mask_token_id, "mask_token_id")
        blockwise = pick(blockwise, "blockwise")
        schedule_passed = draft_schedule is not UNSET
        draft_schedule = pick(draft_schedule, "draft_schedule")
        sizes = (("ngram", prompt_lookup_ngram), ("tokens", prompt_lookup_tokens))
        sizes_passed = [name for name, size in sizes if size is not UNSET]
        prompt_lookup = pick(prompt_lookup, "prompt_lookup")
        prompt_lookup_ngram = pick(prompt_lookup_ngram, "prompt_lookup_ngram")
        prompt_lookup_tokens = pick(prompt_lookup_tokens, "prompt_lookup_tokens")
        # `cache_implementation="static"`, transformers' switch for compiled AR decoding, selects the same for WeDLM
        static = pick(static, "static", getattr(generation_config, "cache_implementation", None) == "static")
        if mask_token_id is None:
            mask_token_id = getattr(model_config, "mask_token_id", None)

        if isinstance(window_size, bool) or not isinstance(window_size, Integral) or window_size < 1:
            raise ValueError(f"`wedlm_window_size` must be an integer >= 1, got {window_size!r}.")
        if entropy_threshold is not None and (
            isinstance(entropy_threshold, bool) or not isinstance(entropy_threshold, Real) or entropy_threshold < 0
        ):
            raise ValueError(
                f"`wedlm_entropy_threshold` must be a number >= 0, or None for one slot per step; "
                f"got {entropy_threshold!r}."
            )
        if isinstance(pos_penalty_factor, bool) or not isinstance(pos_penalty_factor, Real) or pos_penalty_factor < 0:
            raise ValueError(f"`wedlm_pos_penalty_factor` must be a number >= 0, got {pos_penalty_factor!r}.")
        if mask_token_id is None:
            raise ValueError(
                "WeDLM decoding needs a mask token: pass `mask_token_id=` to generate, or set `mask_token_id` on "
                "the model config or its generation config."
            )
        if isinstance(mask_token_id, bool) or not isinstance(mask_token_id, Integral) or not 0 <= mask_token_id < vocab_size:
            raise ValueError(
                f"`mask_token_id` must be an integer id inside the vocabulary [0, {vocab_size}), got {mask_token_id!r}."
            )
        flags = (("wedlm_blockwise", blockwise), ("wedlm_lossless", lossless), ("wedlm_static", static))
        for name, flag in (*flags, ("wedlm_prompt_lookup", prompt_lookup)):
            if not isinstance(flag, bool):
                raise ValueError(f"`{name}` must be True or False, got {flag!r}.")
        if not static and getattr(generation_config, "compile_config", None) is not None:
            logger.warning(
                "`compile_config` is used by WeDLM's static-shape path only; pass cache_implementation='static' (or "
                "wedlm_static=True) to compile the step."
            )
        if blockwise and lossless:
            raise ValueError("`wedlm_blockwise` and `wedlm_lossless` cannot be combined; choose one.")
        if draft_schedule not in DRAFT_SCHEDULES:
            raise ValueError(f"`wedlm_draft_schedule` must be one of {DRAFT_SCHEDULES}, got {draft_schedule!r}.")
        if schedule_passed and not lossless:
            raise ValueError(
                "`wedlm_draft_schedule` sets how lossless mode drafts; pass `wedlm_lossless=True` with it, or drop it."
            )
        for name, size in (("ngram", prompt_lookup_ngram), ("tokens", prompt_lookup_tokens)):
            if isinstance(size, bool) or not isinstance(size, Integral) or size < 1:
                raise ValueError(f"`wedlm_prompt_lookup_{name}` must be an integer >= 1, got {size!r}.")
        if prompt_lookup and not lossless:
            raise ValueError(
                "`wedlm_prompt_lookup=True` drafts from the context for lossless mode to verify; pass "
                "`wedlm_lossless=True` with it, or drop it."
            )
        if sizes_passed and not prompt_lookup:
            raise ValueError(
                f"`wedlm_prompt_lookup_{sizes_passed[0]}` sizes prompt lookup; pass `wedlm_prompt_lookup=True` "
                "(and `wedlm_lossless=True`) with it, or drop it."
            )
        return cls(
            prompt_lookup=prompt_lookup,
            prompt_lookup_ngram=int(prompt_lookup_ngram),
            prompt_lookup_tokens=int(prompt_lookup_tokens),
            blockwise=blockwise,
            lossless=lossless,
            draft_schedule=draft_schedule,
            static=static,
            window_size=int(window_size),
            entropy_threshold=None if entropy_threshold is None else float(entropy_threshold),
            pos_penalty_factor=float(pos_penalty_factor),
            mask_token_id=int(mask_token_id),
        )
