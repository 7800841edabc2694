"""Where lossless mode's drafts come from, behind one small interface asked at fixed points of the step.

A lossless step is plan -> forward -> check -> commit -> schedule -> draft (`lossless.py`). Every draft source
is asked at two points: before the first forward (`first`: drafts for slots 0 on, which the prefill verifies) and
after each commit (`draft`), when the window holds the certain token and whatever the commit kept. The window's
own mask predictions draft first, before the schedule (which weighs what they drafted); every other source drafts
after it, in order, into the slots they find empty (or, for a tree, beside the window). Drafts are only guesses:
the next forward verifies each one, so a source decides how fast decoding goes, never what it outputs. A new draft
source (another lookup, a small draft model) is one new module with these methods, handed to `LosslessPolicy`.
"""

from dataclasses import dataclass
from typing import Protocol

import torch

from .fill import SlotFiller
from .window import Updates, WindowLayout, WindowState


@dataclass
class AfterCommit:
    """What the commit leaves the draft sources."""

    accepted: torch.Tensor | None
    """Per row, how many of the window's drafts passed (None: the forward checked none, the certain token alone)."""
    corrected: torch.Tensor | None
    """Rows that rejected a draft: every prediction of theirs saw it, so they draft from the next forward."""
    draft_probs: torch.Tensor | None
    """Sampling: (rows, window_size, vocab) the distribution each draft is drawn from (a source writes its own)."""
    logits: torch.Tensor | None = None
    slot_physical: torch.Tensor | None = None
    """The forward's logits at its mask slots, and each slot's column in them (None: it fed no mask slot)."""
    with_entropy: bool = False
    """Whether the schedule weighs the predictions' `entropy` (the adaptive schedule's first window)."""
    entropy: torch.Tensor | None = None
    """(rows, window_size) the entropy of each mask prediction, where the mask predictions report it."""


class DraftSource(Protocol):
    """A source of drafts for the window (or, for a tree, beside it)."""

    first_slots: int
    """The most drafts `first` puts in a row's slots 0 on (0: none)."""
    in_chain: torch.Tensor | None
    """Rows whose window drafts this source placed last (None: it places none in the window's chain): the draft
    schedule sizes the window by the mask predictions' drafts alone."""

    def first(self, state: WindowState) -> None:
        """Drafts before the first forward, from slot 0 on (the first forward verifies them)."""

    def draft(self, state: WindowState, after: AfterCommit) -> None:
        """Drafts after a commit, into the slots after the certain token its window leaves empty."""

    def select(self, index: torch.Tensor) -> None:
        """Keep the per-row state of the running rows `index` only."""

    def joined(self, other: "DraftSource") -> Updates:
        """The per-row state with `other`'s rows appended (set by `swap_in`)."""


@dataclass
class MaskPredictions:
    """The window's own drafts: the forward's predictions at its mask slots, each slot filled with its argmax (or
    a sample from the processed scores). A row that rejected a draft fills nothing: every prediction saw the
    rejected token (and a rejected slot's logits predict the slot after it)."""

    layout: WindowLayout
    filler: SlotFiller
    first_slots: int = 0  # (a forward's predictions come after it)
    in_chain: None = None  # (the schedule's own drafts)

    def first(self, state: WindowState) -> None:
        return None

    def draft(self, state: WindowState, after: AfterCommit) -> None:
        if after.logits is None:
            return
        window_size, mask_id = self.layout.window_size, self.layout.mask_id
        fillable = (state.window[:, :window_size] == mask_id) & (self.layout.slots[:, :window_size] >= 1)
        fillable = fillable & ~after.corrected[:, None]
        after.entropy = self.filler.fill(
            state, after.logits, after.slot_physical, fillable, after.draft_probs, with_entropy=after.with_entropy
        )

    def select(self, index: torch.Tensor) -> None:
        return None

    def joined(self, other: "MaskPredictions") -> Updates:
        return []
