"""The running rows' windows: per-row tensors in one dataclass, and the pure window operations of a step.

A window is `width = 2 * window_size` slots per row (a window plus the mask slots appended before a commit); a
slot holds a token or the mask id. Every per-row tensor has the running rows as its first dimension, so the
containers of them (`WindowState`, `StepPlan`, a policy's row state) share one generic `select(index)` for rows
that leave and one `joined(other)` for rows that join (continuous batching, docs/serving.md): `PerRow`, whose
`select_rows` / `joined_rows` make it a member of the running rows (rows.py), where rows join and leave.

A join builds every new value first and sets them only once all are built (`Updates`, `swap_in`): a fault while
rows join (out of memory, say) leaves the running rows as they were, so it fails only the rows being admitted.
"""

from dataclasses import dataclass, field, fields
from typing import Any, NewType

import torch

InputRow = NewType("InputRow", int)
"""A row of the output record (what a caller handed in): fixed while the row is held."""
RunningRow = NewType("RunningRow", int)
"""A row's place among the rows still decoding (the first dimension of every per-row tensor): it moves whenever a
row before it leaves. `WindowState.rows` maps running rows to input rows."""

Updates = list[tuple[Any, dict[str, Any]]]
"""Attribute values a join built, per object they belong to; nothing is set until `swap_in`."""


def swap_in(updates: Updates) -> None:
    """Set every attribute a join built (assignments only: nothing here can fail halfway)."""
    for target, values in updates:
        for name, value in values.items():
            setattr(target, name, value)


@dataclass(frozen=True)
class WindowLayout:
    """What every row's window shares: sizes, the mask id, the slot indices and the feed-order keys (not the token
    budget: rows joined by continuous batching have their own, `WindowState.max_new_tokens`).

    Invariant of every running row between steps: slots at or past its window `length` hold the mask id, so a
    slot is filled exactly when it is not the mask id (no separate liveness test)."""

    mask_id: int
    window_size: int
    slots: torch.Tensor
    """(1, width) slot indices: broadcasts against (rows, slots)."""
    mask_keys: torch.Tensor
    dead_keys: torch.Tensor
    """Sort keys that put live mask slots after the filled ones, and dead slots after both (`feed_order`)."""
    suppressed: torch.Tensor | None = None
    """Token ids whose logits every forward sets to -inf (`suppress_tokens`), or None."""
    first_only: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False, compare=False)
    """`slot_zero_only`'s tensors per batch size, built once: they never change."""

    @classmethod
    def create(
        cls,
        mask_id: int,
        window_size: int,
        device: torch.device,
        suppressed: torch.Tensor | None = None,
    ) -> "WindowLayout":
        width = 2 * window_size  # a window plus the slots appended before a commit
        slots = torch.arange(width, device=device)[None]
        suppressed = None if suppressed is None else suppressed.to(device)
        return cls(mask_id, window_size, slots, slots + width, slots + 2 * width, suppressed)

    def slot_zero_only(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The filled slots (rows, width) and leading count (rows: ones) of windows that hold slot 0 alone, as a
        lossless window of its certain token then masks does every AR step."""
        if rows not in self.first_only:
            self.first_only[rows] = (self.slots.eq(0).expand(rows, -1), self.slots.new_ones(rows))
        return self.first_only[rows]

    @property
    def width(self) -> int:
        return self.slots.shape[1]


class WindowScores:
    """Per-slot scores and/or logits of the window, kept only for `output_scores` / `output_logits`.

    `kinds` maps "scores" / "logits" to (rows, width, vocab) buffers; with neither requested it is empty and every
    method does nothing, so the step pays nothing for outputs nobody asked for."""

    def __init__(self, kinds: dict[str, torch.Tensor]):
        self.kinds = kinds

    @property
    def keeps_scores(self) -> bool:
        return "scores" in self.kinds

    @property
    def keeps_logits(self) -> bool:
        return "logits" in self.kinds

    def select(self, index: torch.Tensor) -> "WindowScores":
        return WindowScores({name: kept[index] for name, kept in self.kinds.items()})

    def joined(self, other: "WindowScores") -> "WindowScores":
        return WindowScores({name: torch.cat([kept, other.kinds[name]]) for name, kept in self.kinds.items()})

    def shift(self, source: torch.Tensor) -> None:
        """Slot i takes slot `source[:, i]`'s values (the window moved forward)."""
        for name, kept in self.kinds.items():
            self.kinds[name] = kept.gather(1, source[..., None].expand(-1, -1, kept.shape[-1]))

    def fill(self, chosen: torch.Tensor, **values: torch.Tensor | None) -> None:
        """The chosen slots of the first `chosen.shape[1]` take `values[kind]` (rows, slots, vocab)."""
        size = chosen.shape[1]
        for name, kept in self.kinds.items():
            kept[:, :size] = torch.where(chosen[..., None], values[name].to(kept.dtype), kept[:, :size])

    def place(self, slots: slice, logits: torch.Tensor, scores: torch.Tensor) -> None:
        """Slots `slots` get their AR `logits` and processed `scores` (lossless mode's verified positions)."""
        for name, kept in self.kinds.items():
            kept[:, slots] = (scores if name == "scores" else logits).to(kept.dtype)


class PerRow:
    """A dataclass whose tensor fields (and `WindowScores`) all have the running rows first; other fields (flags,
    checks, None) are shared by the rows and left alone."""

    def row_fields(self) -> list[tuple[str, Any]]:
        values = ((field.name, getattr(self, field.name)) for field in fields(self))
        return [(name, value) for name, value in values if isinstance(value, (torch.Tensor, WindowScores))]

    def select(self, index: torch.Tensor) -> None:
        """Keep only the running rows `index` (the others left)."""
        for name, value in self.row_fields():
            setattr(self, name, value.select(index) if isinstance(value, WindowScores) else value[index])

    def joined(self, other: "PerRow") -> dict[str, Any]:
        """Every per-row field with `other`'s rows appended, built without touching this one (`swap_in` sets them)."""
        return {
            name: value.joined(theirs) if isinstance(value, WindowScores) else torch.cat([value, theirs])
            for name, value in self.row_fields()
            for theirs in (getattr(other, name),)
        }

    def select_rows(self, index: torch.Tensor) -> None:
        """`select`, as a member of the running rows (`protocols.RowMember`)."""
        self.select(index)

    def joined_rows(self, other: "PerRow") -> Updates:
        """`joined`, as a member of the running rows (`protocols.RowMember`): built, set by `swap_in`."""
        return [(self, self.joined(other))]


@dataclass
class WindowState(PerRow):
    """Per-row decoding state of the running rows (first dimension: the rows still decoding)."""

    rows: torch.Tensor
    """The input row (batch index of the output) of each running row."""
    window: torch.Tensor
    """(rows, width) token of each slot, the mask id where empty."""
    length: torch.Tensor
    """Live slots of each row's window."""
    generated: torch.Tensor
    """Tokens committed to the output."""
    max_new_tokens: torch.Tensor
    """Each row's token budget (one value for a `generate` call; rows joined by continuous batching differ)."""
    processed: torch.Tensor
    """Window slots fed so far (the denominator of p_cache)."""
    first_position: torch.Tensor
    """Logical position of generated token 0 (the row's prompt length without padding)."""
    fill_step: torch.Tensor
    """(rows, width) the forward whose logits filled each slot."""
    done: torch.Tensor
    """Rows whose commit ended them (EOS, a stopping criterion, max_new_tokens); they leave at the next sync."""
    scores: WindowScores
    prompt: torch.Tensor | None
    """The prompt ids, fed together with the first window; None after it."""
    prompt_positions: torch.Tensor | None

    def counters(self) -> dict[str, torch.Tensor]:
        """The per-row counters every policy reports (`WeDLMStats.generated` / `processed`)."""
        return {"generated": self.generated, "processed": self.processed}

    def joined(self, other: "WindowState") -> dict[str, Any]:
        """`PerRow.joined` of rows past their first forward (no prompt left to feed), on both sides."""
        if self.prompt is not None or other.prompt is not None:
            raise ValueError("rows join only after their first forward, which feeds their prompt")
        return super().joined(other)


@dataclass
class StepPlan(PerRow):
    """What a policy decided before a forward, per running row: the window length to feed, the window's start
    among the generated tokens, which slots are filled and how many lead (plain: committed; lossless: the certain
    token and its drafts, or in the first window, which has no certain token yet, prompt lookup's drafts).
    `checks` are 0-dim tensors the step sync reads with everything else."""

    length: torch.Tensor
    start: torch.Tensor
    filled: torch.Tensor
    """(rows, width) slots holding a token (the window does not change between the plan and the forward)."""
    leading: torch.Tensor
    all_columns: bool = False
    """Whether the policy needs the logits of every fed column, not only of the mask columns."""
    checks: tuple[torch.Tensor, ...] = ()
    """Read in the sync of the plan's own rows (a joining batch's, in its own sync)."""
    fewest_filled: int | None = None
    """The fewest filled slots of a running row where the policy knows it (the sync need not count them)."""
    branch_tokens: torch.Tensor | None = None
    """(rows, size) a branch verified beside the window (`tree.py`), for slots `branch_depth` on, `branch_count`
    tokens of it (0: none); None where the policy builds no trees."""
    branch_depth: torch.Tensor | None = None
    branch_count: torch.Tensor | None = None


@dataclass
class Forward:
    """One window forward's result, as the loop hands it to the policy."""

    logits: torch.Tensor
    """(rows, kept, vocab) the logits of the last `kept` fed columns."""
    physical: torch.Tensor
    """(rows, width) each slot's column in `logits` (negative: no logits kept for it)."""
    prompt_logits: torch.Tensor | None
    """With the first window: the AR logits of each row's last prompt token (the first new token's)."""
    fed: int
    mask_columns: int
    """How many of the last fed columns hold mask slots in every row."""
    branch_logits: torch.Tensor | None = None
    """(rows, branch width, vocab) the logits of the branch columns fed before the window, or None."""


@dataclass
class Kept:
    """What the cache keeps of a forward, per row: `count` K/V in window order, at the fed `columns` (rows, n >=
    count) where a tree reordered them (None: the first fed columns)."""

    count: torch.Tensor
    columns: torch.Tensor | None = None


def leading_filled(
    state: WindowState, layout: WindowLayout, blockwise: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which slots are filled, and how many at the front of each row's window (the layout's invariant keeps them
    inside it); `blockwise` (the paper's baseline) counts a window only once it is completely filled."""
    filled = state.window != layout.mask_id
    leading = filled.int().cumprod(1).sum(1)
    if blockwise:
        leading = leading.masked_fill(leading != state.length, 0)
    return filled, leading


def feed_order(filled: torch.Tensor, layout: WindowLayout, length: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, width) the slot fed at each physical column: filled slots first, then the window's mask slots, then
    dead slots (past `length`), each group in slot order; and which slots are live."""
    live = layout.slots < length[:, None]
    order_key = torch.where(filled, layout.slots, torch.where(live, layout.mask_keys, layout.dead_keys))
    return order_key.argsort(dim=1), live


def shift(
    state: WindowState, layout: WindowLayout, by: torch.Tensor, length: torch.Tensor, physical: torch.Tensor
) -> torch.Tensor:
    """Drop each row's first `by` slots of a window of `length`; return, for each remaining slot of the first
    `window_size`, where the last forward's logits of it are (`physical`: the same per slot before the shift)."""
    source = (layout.slots + by[:, None]).clamp(max=layout.width - 1)
    state.length = length - by
    state.window = state.window.gather(1, source).masked_fill(layout.slots >= state.length[:, None], layout.mask_id)
    state.fill_step = state.fill_step.gather(1, source)
    state.scores.shift(source)
    return physical.gather(1, source[:, : layout.window_size])
