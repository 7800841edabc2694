"""What the decoding loop (loop.py) asks of a step policy (plain.py, lossless.py) and of a forward backend
(dynamic.py, pool.py): the loop knows them by these protocols alone, so a new one plugs in without touching it."""

from typing import Protocol

import torch

from .window import Forward, Kept, RunningRow, StepPlan, Updates, WindowState


class RowMember(Protocol):
    """Per-row state whose tensors have the running rows first (`PerRow` dataclasses, step policies), moved by
    `rows.RunningRows` alone."""

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only running rows `index` (the others left)."""

    def joined_rows(self, other: "RowMember") -> Updates:
        """`other`'s rows (a member of the same kind) appended after these, built, not yet set (`swap_in`)."""


class StepPolicy(RowMember, Protocol):
    counter_names: tuple[str, ...]
    """Names of the per-row counters `counters()` reports, besides the window state's own."""

    def plan(self, state: WindowState) -> StepPlan: ...

    def checked(self, values: list[int]) -> None:
        """Act on the values of `StepPlan.checks`, read in the sync (e.g. raise)."""

    def update(self, state: WindowState, plan: StepPlan, forward: Forward) -> Kept:
        """Consume the forward; return which K/V of its window the cache keeps, per row."""

    def counters(self) -> dict[str, torch.Tensor]: ...


class ForwardBackend(Protocol):
    def shape(self, fed: int, mask_columns: int) -> tuple[int, int]:
        """The width a forward feeds and the mask columns in it, from the sync's values."""

    def sync_values(self, committed: torch.Tensor) -> list[torch.Tensor]:
        """Tensors `commit` needs (0-dim, or one value per running row), read flat in the step sync."""

    def commit(self, committed: torch.Tensor, values: list[int], columns: torch.Tensor | None = None) -> None:
        """Keep each row's first `committed` K/V of the last forward, at its fed `columns` (`Kept`) if given."""

    def select_rows(self, index: torch.Tensor, kept: list[RunningRow]) -> None:
        """Only running rows `kept` (`index`: the same on the device) go on."""

    def joined_rows(self, other: "ForwardBackend") -> Updates:
        """The rows of `other` (a `DynamicBackend` after their first step) appended, e.g. their cached K/V: built
        (without changing what the running rows read), not yet set."""

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, window_live: torch.Tensor,
        mask_slots: torch.Tensor, logits_to_keep: int, window_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The logits of the last `logits_to_keep` fed columns; `mask_slots` (rows, columns) marks which of the last
        columns are mask slots (`mask_slots.forward_with_mask_slots`, for layers that act there alone);
        `window_mask` (rows, fed, fed), where given, says which fed column sees which instead of causal order (a
        tree, `tree.py`)."""
