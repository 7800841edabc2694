"""The mask slots of the forward in progress, for layers that act at mask slots alone (a draft-only adapter).

Such a layer must change the model at the slots the decoder placed as masks and nowhere else: not at a prompt token
that happens to be the mask id, not in a forward outside WeDLM decoding (plain `generate()`, AR beside WeDLM on the
same model). Only the decoder knows those slots, and a forward keyword cannot carry them: transformers hands its
keywords down to the attention functions, never to the projections. So the decoder sets them in a `ContextVar` for
the duration of its forward (`forward_with_mask_slots`). A context variable belongs to one thread and is reset when
the forward returns, so two threads decoding one model each see their own slots, and every other forward sees
none; a hook or an attribute on the model would be shared by all of them.

The feed order makes the decoder's slots dense: observed tokens first and mask slots last in every row, so each
row's mask slots lie among the forward's last `columns` positions, `columns` being the most mask slots any row has
(the host knows it from the step's one read). A layer works on that static slice (`suffix`), its cost proportional
to the mask slots, with no host read to find them. Training's prediction stream puts masks last in every block,
not in every row, so it names its slots by position instead (`index`, found once per step).
"""

from contextvars import ContextVar
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MaskSlots:
    """Where a forward of `rows` x `length` positions has its mask slots: `suffix` or `index`, the other None."""

    rows: int
    length: int
    suffix: torch.Tensor | None = None
    """(rows, columns, 1) boolean: True at the mask slots among each row's last `columns` positions."""
    index: torch.Tensor | None = None
    """The mask slots' positions in the forward flattened to `rows * length`."""


MASK_SLOTS: ContextVar[MaskSlots | None] = ContextVar("wedlm_mask_slots", default=None)
"""The mask slots of the forward this thread is running, or None (a forward outside WeDLM decoding)."""


def forward_with_mask_slots(call, mask: torch.Tensor, **inputs):
    """`call(**inputs)` with its mask slots set for the forward's duration: `mask` (rows, columns) marks them among
    each row's last `columns` input positions (no columns: a plain call)."""
    if mask.shape[1] == 0:
        return call(**inputs)
    rows, length = inputs["input_ids"].shape
    return _with(MaskSlots(rows, length, suffix=mask[..., None]), call, inputs)


def forward_with_mask_positions(call, mask: torch.Tensor, **inputs):
    """`call(**inputs)` with its mask slots set for the forward's duration: `mask` (rows, length) marks them
    anywhere in the input (one host read, to find them)."""
    rows, length = inputs["input_ids"].shape
    return _with(MaskSlots(rows, length, index=mask.reshape(-1).nonzero().squeeze(1)), call, inputs)


def _with(slots: MaskSlots, call, inputs: dict):
    token = MASK_SLOTS.set(slots)
    try:
        return call(**inputs)
    finally:
        MASK_SLOTS.reset(token)
