"""The demo's pure logic: slider ranges and their validation, `generate` keywords, stats text and the step view.

Nothing here touches Gradio or a model, so the page's behaviour on bad input, its defaults, the verdict on each run
and the HTML it shows are unit-tested directly.
"""

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from numbers import Real

from wedlm_hf.generation.options import BY_SETTING
from wedlm_hf.generation.settings import (
    DEFAULT_ENTROPY_THRESHOLD,
    DEFAULT_POS_PENALTY_FACTOR,
    DEFAULT_WINDOW_SIZE,
)


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
    pos_penalty: float
    temperature: float
    max_new_tokens: int
    lossless: bool = False
    """WeDLM drafts verified against the model's own AR logits: the WeDLM side then equals the AR side."""


SLIDERS: dict[str, SliderSpec] = {
    "window_size": SliderSpec("Window size W", 1, 64, 1, DEFAULT_WINDOW_SIZE, "mask slots decoded in parallel"),
    "entropy_threshold": SliderSpec(
        "Entropy threshold τ",
        0.0,
        3.0,
        0.05,
        DEFAULT_ENTROPY_THRESHOLD,
        "fill slots whose adjusted entropy is below τ (0: one per step)",
    ),
    "pos_penalty": SliderSpec(
        "Position penalty λ", 0.0, 0.5, 0.01, DEFAULT_POS_PENALTY_FACTOR, "entropy added per slot of distance"
    ),
    "temperature": SliderSpec("Temperature", 0.0, 2.0, 0.05, 0.0, "0: greedy; above 0: sampling on both sides"),
    "max_new_tokens": SliderSpec("Max new tokens", 1, 256, 1, 64, "on each side"),
}
"""Slider defaults are the library's (what `generate` uses when nothing else says); the page starts from the loaded
checkpoint's generation config instead, see `checkpoint_defaults`."""

CHECKPOINT_KEYS = {
    slider: BY_SETTING[setting].keyword
    for slider, setting in (
        ("window_size", "window_size"), ("entropy_threshold", "entropy_threshold"), ("pos_penalty", "pos_penalty_factor")
    )
}
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
    pos_penalty: object,
    temperature: object,
    max_new_tokens: object,
    lossless: object = False,
) -> DecodeParams:
    """Slider values as the page (or its API, which skips the sliders' ranges) sent them, checked, else `InputError`."""
    values = (window_size, entropy_threshold, pos_penalty, temperature, max_new_tokens)
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
        options["wedlm_window_size"] = params.window_size
        options["wedlm_entropy_threshold"] = params.entropy_threshold
        options["wedlm_pos_penalty_factor"] = params.pos_penalty
        options["wedlm_lossless"] = params.lossless
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


def _hue(step: int) -> int:
    """Well-separated hues for consecutive forwards (golden-angle steps around the colour wheel)."""
    return round(step * 137.508) % 360


def _visible(token: str) -> str:
    """Whitespace made visible, so a space or newline token still occupies a cell."""
    return token.replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥") or "∅"


def _marked_newlines(token: str) -> str:
    """A newline token shown as ⏎ before the line break, so it has a visible, coloured mark in the text line."""
    return token.replace("\n", "⏎\n")


_CELL_LABELS = {
    "commit": "committed by this forward (its K/V stay cached)",
    "filled": "filled earlier, fed as a token, not yet committed",
    "new": "predicted by this forward (was a mask)",
    "mask": "mask slot",
}


def render_step_view(
    tokens: Sequence[str],
    fill_steps: Sequence[int],
    commit_steps: Sequence[int],
    window_size: int,
    forwards: int | None = None,
    band_width: int = 140,
) -> str:
    """HTML showing when each generated token was filled and committed, and the window sliding over them.

    The text line colours each token's background by the forward that committed it and its underline by the forward
    that filled it. The grid below has one row per forward: the window it fed starts at the first uncommitted token
    and spans the tokens it commits plus `window_size` slots (spec §2 appends a mask slot per committed one); each
    cell says whether that slot was committed, already filled, newly predicted, or still a mask. Rows past
    `forwards` are commits that needed no forward (the run ended there). The grid is cut into bands of tokens
    about `band_width` characters wide, stacked vertically, so it wraps inside the page instead of running off its
    right edge; a forward shows in a band where its window has more than masks.
    """
    if not len(tokens) == len(fill_steps) == len(commit_steps):
        raise ValueError(
            f"one fill and one commit step per token expected, got {len(tokens)} tokens, "
            f"{len(fill_steps)} fill steps and {len(commit_steps)} commit steps."
        )
    if not tokens:
        return '<div class="wd-steps"><p>No tokens were generated.</p></div>'
    line = "".join(
        f'<span class="wd-tok" style="background:hsl({_hue(c)},70%,85%);border-bottom-color:hsl({_hue(f)},70%,40%)" '
        f'title="token {t}: filled in forward {f}, committed in forward {c}">'
        f"{html.escape(_marked_newlines(token))}</span>"
        for t, (token, f, c) in enumerate(zip(tokens, fill_steps, commit_steps))
    )
    windows = []  # (forward, first token fed, one past the last token fed)
    for step in range(1, max(commit_steps) + 1):
        start = sum(1 for c in commit_steps if c < step)
        end = min(sum(1 for c in commit_steps if c <= step) + window_size, len(tokens))  # + the slots appended
        windows.append((step, start, end))
    bands = []
    for band_start, band_end in _bands([_visible(token) for token in tokens], band_width):
        cells, row = [], 0
        for step, start, end in windows:
            first, last = max(start, band_start), min(end, band_end)
            states = [_cell_state(t, step, fill_steps, commit_steps) for t in range(first, last)]
            if all(state == "mask" for state in states):
                continue  # the window only reaches into this band with masks
            row += 1
            label = f"{step}" if forwards is None or step <= forwards else f"{step} (no forward)"
            cells.append(f'<div class="wd-label" style="grid-row:{row}">{label}</div>')
            for t, state in zip(range(first, last), states):
                text = "·" if state == "mask" else _visible(tokens[t])
                cells.append(
                    f'<div class="wd-cell wd-{state}" style="grid-row:{row};grid-column:{t - band_start + 2}" '
                    f'title="token {t}: {_CELL_LABELS[state]}">{html.escape(text)}</div>'
                )
        bands.append(
            f'<div class="wd-band-title">tokens {band_start}–{band_end - 1}</div>'
            f'<div class="wd-grid" style="grid-template-columns:auto repeat({band_end - band_start},minmax(0,auto))">'
            f'{"".join(cells)}</div>'
        )
    legend = "".join(
        f'<span class="wd-cell wd-{state}">{html.escape(text)}</span>' for state, text in _CELL_LABELS.items()
    )
    return (
        '<div class="wd-steps">'
        f'<p class="wd-line">{line}</p>'
        '<p class="wd-caption">Background: forward that committed the token · underline: forward that filled it '
        "(hover for numbers).</p>"
        f'<div class="wd-legend">{legend}</div>'
        f'<div class="wd-bands">{"".join(bands)}</div>'
        "</div>"
    )


CELL_MAX_CHARACTERS = 8
"""Longer tokens are cut with an ellipsis in the grid (the text line above shows them whole)."""


def _bands(visible_tokens: Sequence[str], width: int) -> list[tuple[int, int]]:
    """Consecutive token ranges whose cells (text capped at `CELL_MAX_CHARACTERS`, plus about two characters of
    padding) fit in `width` characters; at least one token each."""
    bands, start, used = [], 0, 0
    for index, token in enumerate(visible_tokens):
        cell = min(len(token), CELL_MAX_CHARACTERS) + 2
        if used + cell > width and index > start:
            bands.append((start, index))
            start, used = index, 0
        used += cell
    if start < len(visible_tokens):
        bands.append((start, len(visible_tokens)))
    return bands


def _cell_state(token: int, step: int, fill_steps: Sequence[int], commit_steps: Sequence[int]) -> str:
    if commit_steps[token] == step:
        return "commit"
    if fill_steps[token] < step:
        return "filled"
    return "new" if fill_steps[token] == step else "mask"


STEP_VIEW_CSS = """
.wd-steps { font-family: ui-monospace, monospace; font-size: 13px; max-width: 100%; }
.wd-line { white-space: pre-wrap; overflow-wrap: anywhere; line-height: 1.9; }
.wd-tok { border-bottom: 3px solid; padding: 1px 0; }
.wd-caption { font-family: system-ui, sans-serif; font-size: 12px; opacity: .8; }
.wd-legend { display: flex; gap: 6px; flex-wrap: wrap; margin: 6px 0; font-family: system-ui, sans-serif; }
.wd-bands { max-height: 640px; overflow: auto; }
.wd-band-title { font-family: system-ui, sans-serif; font-size: 12px; opacity: .7; margin: 8px 0 2px; }
.wd-grid { display: grid; justify-content: start; gap: 2px; max-width: 100%; }
.wd-label { grid-column: 1; text-align: right; padding-right: 6px; opacity: .7; white-space: nowrap; }
.wd-cell { padding: 1px 4px; border-radius: 3px; white-space: pre; text-align: center; color: #111; }
.wd-grid .wd-cell { max-width: 8ch; overflow: hidden; text-overflow: ellipsis; }
.wd-commit { background: #7fd88f; font-weight: bold; }
.wd-filled { background: #ffe08a; }
.wd-new { background: #9cc8ff; }
.wd-mask { background: #e4e4e4; color: #777; }
"""
"""Styles of the step view's classes; the per-forward colours are inline because they depend on the run."""
