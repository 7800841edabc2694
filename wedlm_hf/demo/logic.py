"""The demo's pure logic: slider ranges and their validation, `generate` keywords, stats text and the step view.

Nothing here touches Gradio or a model, so the page's behaviour on bad input and the HTML it shows are unit-tested
directly.
"""

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from numbers import Real


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
    "window_size": SliderSpec("Window size W", 1, 64, 1, 16, "mask slots decoded in parallel"),
    "entropy_threshold": SliderSpec(
        "Entropy threshold τ", 0.0, 3.0, 0.05, 0.4, "fill slots whose adjusted entropy is below τ (0: one per step)"
    ),
    "pos_penalty": SliderSpec("Position penalty λ", 0.0, 0.5, 0.01, 0.02, "entropy added per slot of distance"),
    "temperature": SliderSpec("Temperature", 0.0, 2.0, 0.05, 0.0, "0: greedy; above 0: sampling on both sides"),
    "max_new_tokens": SliderSpec("Max new tokens", 1, 256, 1, 64, "on each side"),
}

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
    if lossless and params.temperature > 0:
        raise InputError("Lossless mode reproduces greedy decoding: set the temperature to 0.")
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


def _hue(step: int) -> int:
    """Well-separated hues for consecutive forwards (golden-angle steps around the colour wheel)."""
    return round(step * 137.508) % 360


def _visible(token: str) -> str:
    """Whitespace made visible, so a space or newline token still occupies a cell."""
    return token.replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥") or "∅"


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
) -> str:
    """HTML showing when each generated token was filled and committed, and the window sliding over them.

    The text line colours each token's background by the forward that committed it and its underline by the forward
    that filled it. The grid below has one row per forward: the window it fed starts at the first uncommitted token
    and spans the tokens it commits plus `window_size` slots (spec §2 appends a mask slot per committed one); each
    cell says whether that slot was committed, already filled, newly predicted, or still a mask. Rows past
    `forwards` are commits that needed no forward (the run ended there).
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
        f'title="token {t}: filled in forward {f}, committed in forward {c}">{html.escape(token)}</span>'
        for t, (token, f, c) in enumerate(zip(tokens, fill_steps, commit_steps))
    )
    rows = []
    last_row = max(commit_steps)
    for step in range(1, last_row + 1):
        start = sum(1 for c in commit_steps if c < step)
        end = min(sum(1 for c in commit_steps if c <= step) + window_size, len(tokens))  # + the slots appended
        label = f"{step}" if forwards is None or step <= forwards else f"{step} (no forward)"
        rows.append(f'<div class="wd-label" style="grid-row:{step}">{label}</div>')
        for t in range(start, end):
            if commit_steps[t] == step:
                state, text = "commit", tokens[t]
            elif fill_steps[t] < step:
                state, text = "filled", tokens[t]
            elif fill_steps[t] == step:
                state, text = "new", tokens[t]
            else:
                state, text = "mask", "·"
            rows.append(
                f'<div class="wd-cell wd-{state}" style="grid-row:{step};grid-column:{t + 2}" '
                f'title="token {t}: {_CELL_LABELS[state]}">{html.escape(_visible(text))}</div>'
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
        f'<div class="wd-grid" style="grid-template-columns:auto repeat({len(tokens)},auto)">{"".join(rows)}</div>'
        "</div>"
    )


STEP_VIEW_CSS = """
.wd-steps { font-family: ui-monospace, monospace; font-size: 13px; }
.wd-line { white-space: pre-wrap; line-height: 1.9; }
.wd-tok { border-bottom: 3px solid; padding: 1px 0; }
.wd-caption { font-family: system-ui, sans-serif; font-size: 12px; opacity: .8; }
.wd-legend { display: flex; gap: 6px; flex-wrap: wrap; margin: 6px 0; font-family: system-ui, sans-serif; }
.wd-grid { display: grid; justify-content: start; gap: 2px; overflow: auto; max-height: 480px; padding-bottom: 4px; }
.wd-label { grid-column: 1; text-align: right; padding-right: 6px; opacity: .7; white-space: nowrap; }
.wd-cell { padding: 1px 4px; border-radius: 3px; white-space: pre; text-align: center; color: #111; }
.wd-commit { background: #7fd88f; font-weight: bold; }
.wd-filled { background: #ffe08a; }
.wd-new { background: #9cc8ff; }
.wd-mask { background: #e4e4e4; color: #777; }
"""
"""Styles of the step view's classes; the per-forward colours are inline because they depend on the run."""
