"""The mask slots of the window forward in progress, for layers that act at mask slots alone (a draft-only adapter).

Such a layer must change the model at the slots the decoder placed as masks and nowhere else: not at a prompt token
that happens to be the mask id, not in a forward outside WeDLM decoding (plain `generate()`, AR beside WeDLM on the
same model). Only the decoder knows those slots, and a forward keyword cannot carry them: transformers hands its
keywords down to the attention functions, never to the projections. So the decoder sets them in a `ContextVar` for
the duration of its forward (`forward_with_mask_slots`). A context variable belongs to one thread and is reset when
the forward returns, so two threads decoding one model each see their own slots, and every other forward sees
none; a hook or an attribute on the model would be shared by all of them.

The feed order makes the slots dense: observed tokens first and mask slots last in every row, so each row's mask
slots lie among the forward's last `columns` positions, `columns` being the most mask slots any row has (the host
knows it from the step's one read). A layer works on that static slice, its cost proportional to the mask slots,
and needs no host read to find them.
"""

from contextvars import ContextVar
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MaskSlots:
    """Which of a forward's last positions are mask slots."""

    mask: torch.Tensor
    """(rows, columns, 1) boolean: True at the mask slots among each row's last `columns` positions."""
    length: int
    """Positions the forward feeds per row (the mask's columns are its last ones)."""


MASK_SLOTS: ContextVar[MaskSlots | None] = ContextVar("wedlm_mask_slots", default=None)
"""The mask slots of the forward this thread is running, or None (a forward outside WeDLM decoding)."""


def forward_with_mask_slots(call, mask: torch.Tensor, **inputs):
    """`call(**inputs)`, its last `mask.shape[1]` input positions marked per row by `mask` (rows, columns; True at a
    mask slot) for the forward's duration; with no columns, a plain call."""
    if mask.shape[1] == 0:
        return call(**inputs)
    token = MASK_SLOTS.set(MaskSlots(mask[..., None], inputs["input_ids"].shape[1]))
    try:
        return call(**inputs)
    finally:
        MASK_SLOTS.reset(token)
