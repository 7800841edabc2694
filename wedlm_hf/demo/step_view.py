"""The demo's step view: the HTML that shows, forward by forward, which window slots were predicted, filled and
committed. Pure (no Gradio, no model), so the HTML is unit-tested directly."""

import html
from collections.abc import Sequence


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
