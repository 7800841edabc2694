"""Prompt lookup as lossless mode's draft sources (`draft_source.py`): into the window's own chain, or as branches.

Before the first forward both put the prompt's continuation in slots 0 on, which the prefill verifies (as
transformers' prompt lookup proposes candidates in its first forward). After that, `LookupChain` drafts the
slots after the certain token in rows whose mask predictions drafted nothing there and whose mask drafts are off:
adaptive, rows at zero drafts (a row whose limit was only cut keeps its mask drafts: on the embedded
checkpoint's counting prompts lookup there cost 10.0 -> 7.2 tokens per forward); `"full"`, unless the row's last
lookup drafts all failed (the sources then take turns): a failed lookup draft costs a row whose mask drafts pass
the forward predicting its next ones. `LookupBranches` (a tree, `tree.py`) makes every row's lookup drafts its
branches instead, verified beside the window's (not under penalties, whose scores a branch would need along its
own prefix): a failed branch costs its columns, not the window's predictions.
"""

from dataclasses import dataclass

import torch

from .draft_schedule import DraftSchedule
from .draft_source import AfterCommit
from .lookup import PromptLookup
from .record import OutputRecord
from .tree import Branch
from .window import PerRow, Updates, WindowLayout, WindowState


@dataclass
class LookupRows(PerRow):
    """`LookupChain`'s per-row flags."""

    in_chain: torch.Tensor
    """Whether the row's window drafts came from the context (the adaptive limit ignores those)."""
    passing: torch.Tensor
    """Whether its last lookup drafts were not all rejected (`"full"`: it drafts from the context again)."""


class FromContext:
    """What both lookup sources share: the search, where its results go, and the drafts of the first window."""

    def __init__(self, lookup: PromptLookup, record: OutputRecord, layout: WindowLayout):
        self.lookup, self.record, self.layout = lookup, record, layout
        self.first_slots = lookup.slots(layout)

    def _first(self, state: WindowState) -> torch.Tensor:
        """Every running row with a match takes the prompt's continuation in slots 0 on; returns which did."""
        return self.lookup.draft(self.record, state, self.layout, ~state.done, None, prefill=True)


class LookupChain(FromContext):
    """Prompt lookup into the window's own chain, in the rows the schedule leaves without mask drafts."""

    def __init__(
        self, lookup: PromptLookup, record: OutputRecord, layout: WindowLayout, state: WindowState,
        schedule: DraftSchedule | None,
    ):
        super().__init__(lookup, record, layout)
        self.schedule = schedule
        """The adaptive schedule (None: `"full"`): rows at zero drafts take the context's."""
        self.rows = LookupRows(torch.zeros_like(state.done), torch.ones_like(state.done))

    @property
    def in_chain(self) -> torch.Tensor:
        return self.rows.in_chain

    def first(self, state: WindowState) -> None:
        self.rows.in_chain = self._first(state)

    def draft(self, state: WindowState, after: AfterCommit) -> None:
        rows = self.rows
        if after.accepted is not None:  # (a forward of certain tokens alone checked none: the rows keep theirs)
            rows.passing = ~rows.in_chain | (after.accepted > 0)
        eligible = state.window[:, 1] == self.layout.mask_id
        eligible &= self.schedule.draft_limit == 0 if self.schedule is not None else rows.passing
        rows.in_chain = self.lookup.draft(self.record, state, self.layout, eligible, after.draft_probs)

    def select(self, index: torch.Tensor) -> None:
        self.rows.select(index)

    def joined(self, other: "LookupChain") -> Updates:
        return [(self.rows, self.rows.joined(other.rows))]


class LookupBranches(FromContext):
    """Prompt lookup's continuations as branches beside the window (`PromptLookup.matches` of them per row)."""

    in_chain = None  # (the window's drafts are the mask predictions' after the first forward)

    def __init__(self, lookup: PromptLookup, record: OutputRecord, layout: WindowLayout, state: WindowState):
        super().__init__(lookup, record, layout)
        self.branch = Branch.empty(state.length, lookup.matches, self.first_slots)

    def first(self, state: WindowState) -> None:
        self._first(state)

    def draft(self, state: WindowState, after: AfterCommit) -> None:
        found = self.lookup.continuation(self.record, state)
        if found is None:
            self.branch.count = torch.zeros_like(self.branch.count)
            return
        tokens, count = found
        penalised = None if self.record.sampling is None else self.record.sampling.penalised
        if penalised is not None:
            count = count.masked_fill(penalised[state.rows, None], 0)
        room = torch.clamp(state.max_new_tokens - state.generated, max=self.layout.window_size)
        self.branch.propose(state.window, self.layout.mask_id, tokens, count, room)

    def select(self, index: torch.Tensor) -> None:
        self.branch.select(index)

    def joined(self, other: "LookupBranches") -> Updates:
        return [(self.branch, self.branch.joined(other.branch))]
