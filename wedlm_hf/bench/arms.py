"""The decoding methods a benchmark compares ("arms"), each one entry of `FAMILIES`.

An arm decodes one prompt (greedily unless its keywords sample) and returns its continuation plus WeDLM
statistics when it has them. Every `generate`-based family is just its keyword arguments, so a new method (e.g.
`wedlm_lossless`) is one line.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from ..generation.options import BY_KEYWORD
from ..generation.reference import reference_decode
from ..generation.settings import WeDLMSettings

PROMPT_LOOKUP_TOKENS = 10

FAMILIES: dict[str, dict] = {
    "ar": {"decoding": "ar"},
    "prompt_lookup": {"decoding": "ar", "prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS},
    "wedlm": {"decoding": "wedlm"},
    "wedlm_blockwise": {"decoding": "wedlm", "wedlm_blockwise": True},
    "wedlm_lossless": {"decoding": "wedlm", "wedlm_lossless": True},
    "wedlm_lossless_lookup": {"decoding": "wedlm", "wedlm_lossless": True, "wedlm_prompt_lookup": True},
    "wedlm_lossless_sampled": {"decoding": "wedlm", "wedlm_lossless": True, "do_sample": True, "temperature": 0.7},
    "nocache": {"decoding": "reference"},
}
"""Family name -> `generate` keywords; `decoding="reference"` runs the cache-free `reference_decode` instead.
`wedlm_lossless_sampled` draws from the model's distribution at temperature 0.7 (its output is not the ar arm's;
its tokens per forward compare with `wedlm_lossless`)."""

THRESHOLD_SWEPT = ("wedlm", "wedlm_blockwise")
"""Families that are also run at every threshold of the sweep (speed/quality curve, paper Fig. 4a)."""

COMPILED_FAMILIES: dict[str, dict] = {
    "ar_compiled": {"decoding": "ar", "cache_implementation": "static"},
    "wedlm_compiled": {"decoding": "wedlm", "cache_implementation": "static"},
}
"""With `--compile`, compiled name -> keywords: transformers' static cache + `torch.compile` (the strongest AR a
transformers user has) and WeDLM's static-shape path (generation/pool.py), which `cache_implementation="static"`
selects. Both get the same `compile_config` and a `max_cache_len` that fits every call, so neither recompiles
between prompts. Each is added when its eager family ("ar", "wedlm") runs."""

BASELINE = "ar"
"""The arm every other arm's output is compared with, and whose speed the speed-ups divide by."""


@dataclass
class Decoded:
    tokens: list[int]
    stats: dict | None = None
    """`WeDLMStats.summary()` for WeDLM arms."""


@dataclass(frozen=True)
class Arm:
    name: str
    family: str
    options: dict = field(default_factory=dict)
    threshold: float | None | str = "default"
    """The entropy threshold set by this arm, or "default" when it runs at the model's own setting."""

    def decode(self, model: PreTrainedModel, prompt: Sequence[int], max_new_tokens: int, exact_length: bool) -> Decoded:
        """Greedy continuation of `prompt`; `exact_length` disables EOS so exactly `max_new_tokens` come out."""
        with torch.inference_mode():
            if self.options["decoding"] == "reference":
                return _reference(model, list(prompt), max_new_tokens, exact_length, self.options)
            return _generate(model, prompt, max_new_tokens, exact_length, dict(self.options))


def _generate(
    model: PreTrainedModel, prompt: Sequence[int], max_new_tokens: int, exact_length: bool, options: dict
) -> Decoded:
    input_ids = torch.tensor([list(prompt)], device=model.device)
    if exact_length:
        options["eos_token_id"] = None
    output = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        return_dict_in_generate=True,
        **{"do_sample": False, **options},
    )
    stats = getattr(output, "wedlm_stats", None)
    return Decoded(output.sequences[0, input_ids.shape[1] :].tolist(), stats.summary() if stats is not None else None)


def _reference(
    model: PreTrainedModel, prompt: list[int], max_new_tokens: int, exact_length: bool, options: dict
) -> Decoded:
    """The cache-free reference at the settings `generate(decoding="wedlm", **options)` would resolve to."""
    settings = WeDLMSettings.resolve(
        model.generation_config,
        model.config,
        model.config.get_text_config().vocab_size,
        **{keyword: value for keyword, value in options.items() if keyword in BY_KEYWORD},
    )
    eos = [] if exact_length else model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    tokens, _ = reference_decode(
        model,
        prompt,
        max_new_tokens,
        settings.mask_token_id,
        eos,
        settings.window_size,
        settings.entropy_threshold,
        settings.pos_penalty_factor,
        settings.blockwise,
    )
    return Decoded(tokens)


def threshold_label(threshold: float | None) -> str:
    return "1slot" if threshold is None else f"{threshold:g}"


def check_families(families: Sequence[str]) -> None:
    unknown = set(families) - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown arms {sorted(unknown)}; known: {', '.join(FAMILIES)}")


def build_arms(
    families: Sequence[str] = tuple(FAMILIES), thresholds: Sequence[float | None] = (), compiled: dict | None = None
) -> list[Arm]:
    """Every family at the model's defaults, then the swept families at each threshold (`None`: one slot/step),
    then, given `compiled` (the `compile_config` and `max_cache_len` keywords), the compiled arms."""
    check_families(families)
    arms = [Arm(name, name, FAMILIES[name]) for name in families]
    for name in families:
        if name in THRESHOLD_SWEPT:
            arms += [
                Arm(f"{name}@{threshold_label(t)}", name, FAMILIES[name] | {"wedlm_entropy_threshold": t}, t)
                for t in thresholds
            ]
    if compiled is not None:
        arms += [
            Arm(name, name, options | compiled)
            for name, options in COMPILED_FAMILIES.items()
            if name.removesuffix("_compiled") in families
        ]
    return arms
