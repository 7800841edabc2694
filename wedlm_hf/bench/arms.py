"""The decoding methods a benchmark compares ("arms"), each one entry of `FAMILIES`.

An arm decodes one prompt (greedily unless its keywords sample) and returns its continuation plus WeDLM
statistics when it has them. Every `generate`-based family is just its keyword arguments, so a new method (e.g.
`wedlm_lossless`) is one line. A family with `draft_history` decodes on the engine instead (`WeDLMScheduler`, one
request at a time): its drafts come from the requests answered before, so it needs a history kept across the
prompts of a set (`Arm.serving`), as a server keeps one across its requests.
"""

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from transformers import PreTrainedModel

from ..continuous import GenerationRequest, WeDLMScheduler
from ..generation.options import BY_KEYWORD
from ..generation.reference import reference_decode
from ..generation.settings import WeDLMSettings

PROMPT_LOOKUP_TOKENS = 10
WIDE_LOOKUP = {"wedlm_prompt_lookup_matches": 4, "wedlm_prompt_lookup_tokens": 20, "wedlm_window_size": 21}
"""A wider tree: four matches as branches, 20 tokens each (a window of 21 slots holds them)."""
HISTORY_TOKENS = 1 << 15
"""`draft_history` of the arms that keep one: every prompt and output of a bench set fits."""

FAMILIES: dict[str, dict] = {
    "ar": {"decoding": "ar"},
    "prompt_lookup": {"decoding": "ar", "prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS},
    "wedlm": {"decoding": "wedlm"},
    "wedlm_blockwise": {"decoding": "wedlm", "wedlm_blockwise": True},
    "wedlm_lossless": {"decoding": "wedlm", "wedlm_lossless": True},
    "wedlm_lossless_lookup": {"decoding": "wedlm", "wedlm_lossless": True, "wedlm_prompt_lookup": True},
    "wedlm_lossless_lookup_wide": {
        "decoding": "wedlm", "wedlm_lossless": True, "wedlm_prompt_lookup": True, **WIDE_LOOKUP
    },
    "wedlm_lossless_history": {"decoding": "wedlm", "wedlm_lossless": True, "draft_history": HISTORY_TOKENS},
    "wedlm_lossless_sampled": {"decoding": "wedlm", "wedlm_lossless": True, "do_sample": True, "temperature": 0.7},
    "nocache": {"decoding": "reference"},
}
"""Family name -> `generate` keywords; `decoding="reference"` runs the cache-free `reference_decode` instead.
`wedlm_lossless_sampled` draws from the model's distribution at temperature 0.7 (its output is not the ar arm's;
its tokens per forward compare with `wedlm_lossless`). The lossless arms draft from the mask slots alone
(`wedlm_lossless`), from the row's own context too (`_lookup`; `_lookup_wide` verifies more and longer matches
per forward: `WIDE_LOOKUP`), or from every source (`_history`: the engine's history of earlier requests, which the
engine searches after the row's own context, so lookup comes with it)."""

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
    engine: "HistoryEngine | None" = field(default=None, compare=False, repr=False)
    """History arms: the engine whose history this arm drafts from (see `serving`)."""

    def serving(self, model: PreTrainedModel, primed: Sequence[Sequence[int]], max_new_tokens: int) -> "Arm":
        """This arm with a fresh history that has already answered `primed`; other arms keep no history: itself."""
        if "draft_history" not in self.options:
            return self
        engine = HistoryEngine(model, self.options, exact_length=False)
        for prompt in primed:
            engine.decode(prompt, max_new_tokens)
        return replace(self, engine=engine)

    def decode(self, model: PreTrainedModel, prompt: Sequence[int], max_new_tokens: int, exact_length: bool) -> Decoded:
        """Greedy continuation of `prompt`; `exact_length` disables EOS so exactly `max_new_tokens` come out.
        A history arm not `serving` decodes on a fresh engine: an empty history."""
        with torch.inference_mode():
            if "draft_history" in self.options:
                engine = self.engine or HistoryEngine(model, self.options, exact_length)
                return engine.decode(prompt, max_new_tokens, exact_length)
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


class HistoryEngine:
    """A one-row `WeDLMScheduler` with `draft_history`, kept across requests, run to completion per request."""

    def __init__(self, model: PreTrainedModel, options: dict, exact_length: bool):
        config = copy.deepcopy(model.generation_config)
        for key, value in options.items():
            if key not in ("decoding", "draft_history"):
                setattr(config, key, value)
        config.do_sample = options.get("do_sample", False)
        if exact_length:
            config.eos_token_id = None
        self.exact_length = exact_length
        self.scheduler = WeDLMScheduler(model, config, max_batch_size=1, draft_history=options["draft_history"])

    def decode(self, prompt: Sequence[int], max_new_tokens: int, exact_length: bool = False) -> Decoded:
        if exact_length != self.exact_length:
            raise ValueError(f"this engine decodes with exact_length={self.exact_length}, asked {exact_length}")
        self.scheduler.add(GenerationRequest(list(prompt), max_new_tokens))
        results = []
        while self.scheduler.has_work():
            results += [update.result for update in self.scheduler.step() if update.finished]
        (result,) = results
        if result.error is not None:
            raise RuntimeError(result.error)
        return Decoded(result.tokens, result.stats.summary() if result.stats is not None else None)


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
