"""The plain WeDLM step policy (spec §2): commit the window's leading filled slots, feed the rest, fill the
confident mask slots; with `blockwise`, the paper's baseline that commits a window only once it is all filled."""

import torch

from .fill import SlotFiller
from .record import OutputRecord
from .window import Forward, Kept, StepPlan, Updates, WindowLayout, WindowState, leading_filled, shift


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
