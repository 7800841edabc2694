"""The plain WeDLM step policy (spec §2): commit the window's leading filled slots, feed the rest, fill the
confident mask slots; with `blockwise`, the paper's baseline that commits a window only once it is all filled.

Its window decides its output, so unlike lossless mode's drafts its width cannot follow the batch size: a call
whose batch is past the size from which the window costs more than it commits is warned (`warn_if_window_does_not_pay`).
"""

import torch
from transformers.utils import logging

from .fill import SlotFiller
from .forward_cost import ForwardCost
from .record import OutputRecord
from .window import Forward, Kept, StepPlan, Updates, WindowLayout, WindowState, leading_filled, shift

logger = logging.get_logger(__name__)

PREDICTABLE_SHARE = 0.5
"""About the share of its window a plain step commits where the text is predictable: what its window returns at
best (the embedded checkpoint on counting prompts, W=16: 9.85 tokens per forward, docs/benchmarks.md)."""


def window_loses_from(cost: ForwardCost, window_size: int) -> int | None:
    """The batch size from which a plain step of `window_size` columns per row costs more than the
    `PREDICTABLE_SHARE` of its window it commits at best; None for a window of one or two slots, as narrow as a step
    gets."""
    return cost.loses_from(window_size, PREDICTABLE_SHARE * window_size) if window_size > 2 else None


def warn_if_window_does_not_pay(cost: ForwardCost, rows: int, window_size: int) -> None:
    """Warn once where `rows` rows reach `window_loses_from`."""
    start = window_loses_from(cost, window_size)
    if start is not None and rows >= start:
        logger.warning_once(
            f"Plain WeDLM decoding at batch {rows}: by the cost model of this device (generation/forward_cost.py, "
            f"scale {cost.scale:g}), its {window_size}-slot window costs more per forward than it commits from batch "
            f"{start} on, and its window sets its output, so it cannot narrow. Pass `wedlm_lossless=True` (greedy's "
            "output, its draft width priced per batch size), or a smaller batch or `wedlm_window_size`."
        )


class PlainPolicy:
    counter_names: tuple[str, ...] = ()

    def __init__(self, layout: WindowLayout, record: OutputRecord, filler: SlotFiller, blockwise: bool):
        self.layout = layout
        self.record = record
        self.filler = filler
        self.blockwise = blockwise

    def plan(self, state: WindowState) -> StepPlan:
        """Commit the leading filled slots (the last forward wrote their K/V); grow the window by as many mask
        slots as it commits, within max_new_tokens."""
        filled, leading = leading_filled(state, self.layout, self.blockwise)
        start = state.generated
        state.done |= self.record.commit(state, leading)
        length = torch.minimum(state.length + leading, state.max_new_tokens - start)
        return StepPlan(length=length, start=start, filled=filled, leading=leading)

    def checked(self, values: list[int]) -> None:
        """No checks of its own."""

    def update(self, state: WindowState, plan: StepPlan, forward: Forward) -> Kept:
        """Drop the committed slots, fill from this forward; returns the K/V per row the cache keeps."""
        slot_physical = shift(state, self.layout, plan.leading, plan.length, forward.physical)
        self.filler.fill(
            state, forward.logits, slot_physical, state.window[:, : self.layout.window_size] == self.layout.mask_id
        )
        return Kept(plan.leading)

    def select_rows(self, index: torch.Tensor) -> None:
        """No row state of its own."""

    def joined_rows(self, other: "PlainPolicy") -> Updates:
        """No row state of its own."""
        return []

    def counters(self) -> dict[str, torch.Tensor]:
        return {}
