"""The demo's pure logic: slider ranges and their validation, `generate` keywords and stats text (the step view's
HTML is `step_view`).

Nothing here touches Gradio or a model, so the page's behaviour on bad input, its defaults and the verdict on each
run are unit-tested directly.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from numbers import Real

from wedlm_hf.generation.options import BY_SETTING, DEMO, exposed_to


class InputError(ValueError):
    """A request the page should answer with a message (bad slider value, empty prompt), not a traceback."""


@dataclass(frozen=True)
class SliderSpec:
    """One decoding knob: its label, legal range, step and default, shared by the page and the validation."""

    label: str
    minimum: float
    maximum: float
    step: float
    default: float
    info: str

    @property
    def integer(self) -> bool:
        return float(self.step).is_integer() and float(self.default).is_integer()


@dataclass(frozen=True)
class DecodeParams:
    """Validated decoding parameters of one request; field order is the sliders' order on the page, then the
    lossless checkbox."""

    window_size: int
    entropy_threshold: float
    pos_penalty_factor: float
    temperature: float
    max_new_tokens: int
    lossless: bool = False
    """WeDLM drafts verified against the model's own AR logits: the WeDLM side then equals the AR side."""


def _window_slider(setting: str, label: str, maximum: float, step: float, info: str = "") -> SliderSpec:
    """A WeDLM option's slider: its lower bound, default and help from the options table."""
    option = BY_SETTING[setting]
    return SliderSpec(label, option.accepts.minimum, maximum, step, option.default, info or option.help)


SLIDERS: dict[str, SliderSpec] = {
    "window_size": _window_slider("window_size", "Window size W", 64, 1),
    "entropy_threshold": _window_slider(
        "entropy_threshold", "Entropy threshold τ", 3.0, 0.05,
        "fill slots whose adjusted entropy is below τ (0: one per step)",
    ),
    "pos_penalty_factor": _window_slider("pos_penalty_factor", "Position penalty λ", 0.5, 0.01),
    "temperature": SliderSpec("Temperature", 0.0, 2.0, 0.05, 0.0, "0: greedy; above 0: sampling on both sides"),
    "max_new_tokens": SliderSpec("Max new tokens", 1, 256, 1, 64, "on each side"),
}
"""Slider defaults are the library's (what `generate` uses when nothing else says); the page starts from the loaded
checkpoint's generation config instead, see `checkpoint_defaults`."""

CHECKPOINT_KEYS = {option.setting: option.keyword for option in exposed_to(DEMO) if option.setting in SLIDERS}
"""Sliders a checkpoint's generation config may set, and the attribute it sets them with."""


@dataclass(frozen=True)
class Example:
    label: str
    prompt: str


EXAMPLES = (
    Example("Counting (~10 tokens/forward)", "1, 2, 3, 4, 5, 6, 7, 8,"),
    Example("Python list (~10 tokens/forward)", "x = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, "),
    Example(
        "Known stdlib code (~1.9 tokens/forward)",
        "decoding_table = (\n"
        "    '\\x00'     #  0x00 -> NULL\n"
        "    '\\x01'     #  0x01 -> START OF HEADING\n"
        "    '\\x02'     #  0x02 -> START OF TEXT\n"
        "    '\\x03'     #  0x03 -> END OF TEXT\n"
        "    '\\x04'     #  0x04 -> END OF TRANSMISSION\n"
        "    '\\x05",
    ),
    Example(
        "New Python code (~1 token/forward)",
        "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    ),
    Example("English chat (NOT trained: noise)", "Hello! How are you today?"),
)
"""Prompts for the embedded checkpoint, a 3.5M-parameter model trained on Python source and counting: what it does
well, what it does poorly, and what it was never taught. The known code is the start of a codec table from the
standard library's training split (encodings/cp1252.py)."""


def checkpoint_defaults(generation_config: object | None) -> tuple[dict[str, float], str]:
    """Starting values of the window sliders from a checkpoint's generation config (attributes it lacks keep the
    library defaults), and a line saying where each came from."""
    values = {name: SLIDERS[name].default for name in CHECKPOINT_KEYS}
    from_checkpoint = []
    for name, key in CHECKPOINT_KEYS.items():
        if generation_config is None or not hasattr(generation_config, key):
            continue
        value = getattr(generation_config, key)
        if value is None and name == "entropy_threshold":
            value = 0.0  # None is one slot per step, which the slider spells 0
        if isinstance(value, Real) and not isinstance(value, bool):
            spec = SLIDERS[name]
            values[name] = min(max(value, spec.minimum), spec.maximum)
            from_checkpoint.append(name)
    shown = ", ".join(f"{SLIDERS[name].label.split()[-1]} {values[name]:g}" for name in CHECKPOINT_KEYS)
    if len(from_checkpoint) == len(CHECKPOINT_KEYS):
        source = "the checkpoint's generation config"
    elif from_checkpoint:
        source = "the checkpoint's generation config where it sets them, else the library defaults"
    else:
        source = "the library defaults (no WeDLM settings in the checkpoint's generation config)"
    return values, f"Decoding defaults: {shown}, from {source}."


def lossless_default(generation_config: object | None) -> bool:
    """Whether a checkpoint decodes losslessly by default (`wedlm_lossless` in its generation config, as the
    SmolLM2 adapter's): the lossless checkbox starts there."""
    return getattr(generation_config, "wedlm_lossless", False) is True


def _check(name: str, value: object) -> float:
    spec = SLIDERS[name]
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise InputError(f"{spec.label} must be a number, got {value!r}.")
    if not spec.minimum <= value <= spec.maximum:
        raise InputError(f"{spec.label} must be between {spec.minimum:g} and {spec.maximum:g}, got {value:g}.")
    if spec.integer and not float(value).is_integer():
        raise InputError(f"{spec.label} must be a whole number, got {value:g}.")
    return value


def validate_params(
    window_size: object,
    entropy_threshold: object,
    pos_penalty_factor: object,
    temperature: object,
    max_new_tokens: object,
    lossless: object = False,
) -> DecodeParams:
    """Slider values as the page (or its API, which skips the sliders' ranges) sent them, checked, else `InputError`."""
    values = (window_size, entropy_threshold, pos_penalty_factor, temperature, max_new_tokens)
    checked = (_check(name, value) for name, value in zip(SLIDERS, values))
    params = DecodeParams(*(int(v) if spec.integer else float(v) for spec, v in zip(SLIDERS.values(), checked)))
    if not isinstance(lossless, bool):
        raise InputError(f"Lossless must be true or false, got {lossless!r}.")
    return replace(params, lossless=lossless)


def validate_prompt(prompt: object) -> str:
    """The prompt to continue; blank or missing prompts are an `InputError` (there is nothing to condition on)."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise InputError("Type a prompt first.")
    return prompt


def generate_options(params: DecodeParams, decoding: str) -> dict:
    """`generate` keywords for one side: both sides share length and sampling; only WeDLM gets the window knobs."""
    options: dict = {
        "decoding": decoding,
        "max_new_tokens": params.max_new_tokens,
        "do_sample": params.temperature > 0,
        "return_dict_in_generate": True,
    }
    if params.temperature > 0:
        options["temperature"] = params.temperature
    if decoding == "wedlm":
        options.update({option.keyword: getattr(params, option.setting) for option in exposed_to(DEMO)})
    return options


def format_stats(name: str, tokens: int, seconds: float, forwards: int | None = None, note: str = "") -> str:
    """One line of speed figures; `tokens/forward` appears only once the run is over and its forwards are known."""
    parts = [f"**{name}**", f"{tokens} tokens"]
    if forwards is not None:
        per_forward = tokens / forwards if forwards else 0.0
        parts += [f"{forwards} forwards", f"{per_forward:.2f} tokens/forward"]
    parts.append(f"{tokens / seconds:.1f} tokens/s" if seconds > 0 else "– tokens/s")
    if note:
        parts.append(note)
    return " · ".join(parts)


def first_difference(wedlm_ids: Sequence[int], ar_ids: Sequence[int]) -> int | None:
    """Index of the first generated token where the sides differ (a side that stopped early differs at its end);
    None when they are identical."""
    for index, (ours, theirs) in enumerate(zip(wedlm_ids, ar_ids)):
        if ours != theirs:
            return index
    return None if len(wedlm_ids) == len(ar_ids) else min(len(wedlm_ids), len(ar_ids))


def format_verdict(
    wedlm_ids: Sequence[int],
    wedlm_seconds: float,
    ar_ids: Sequence[int],
    ar_seconds: float,
    tokens_per_forward: float,
    sampled: bool = False,
) -> str:
    """The run's bottom line: WeDLM's wall-clock speed-up over AR (ratio of tokens/s), its tokens per forward, and
    whether its text is the AR text ("identical to AR") or where it departs from it (tokens numbered from 0)."""
    if wedlm_ids and ar_ids and wedlm_seconds > 0 and ar_seconds > 0:
        speedup = (len(wedlm_ids) / wedlm_seconds) / (len(ar_ids) / ar_seconds)
        speed = f"**WeDLM x{speedup:.2f} vs AR** (tokens/s)"
    else:
        speed = "**WeDLM vs AR**: no speed-up to report (a side produced nothing)"
    difference = first_difference(wedlm_ids, ar_ids)
    if difference is None:
        same = "identical to AR"
    else:
        same = f"diverges from AR at token {difference}" + (" (both sides sample)" if sampled else "")
    return f"{speed} · {tokens_per_forward:.2f} tokens/forward · {same}"
