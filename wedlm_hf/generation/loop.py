"""The decoding loop: one host sync per step, then the policy's and the backend's calls, top to bottom.

    plan    = policy.plan(state)           commit what the last forward settled; size the next forward
    sync    = step_sync(...)               the one host read: width, mask columns, running rows, cache sizes
    backend.commit / rows leave            apply the last forward's cache commit; finished rows leave
    forward = feed(...)                    the window forward (filled slots first, masks last)
    kept    = policy.update(...)           shift, fill, verify; the K/V the cache keeps, applied at the next sync

Policies (plain.py, lossless.py) and backends (dynamic.py, pool.py) are objects handed to `run`, as
transformers' assisted-decoding loop is handed a candidate generator; a new one implements a protocol of
protocols.py.
`DecodeLoop` holds the loop between steps, so continuous batching can join rows at a step boundary, and rows can
move to another backend after their first step (`RunningRows.hand_over`: the prompt's forward runs on the dynamic
backend, the steps after it on a pool of K/V blocks); every way rows join, leave or move is `RunningRows` (rows.py).
"""

from dataclasses import dataclass

import torch

from .outputs import ENDED_BY, WeDLMStats
from .protocols import ForwardBackend, StepPolicy
from .record import OutputRecord
from .rows import RunningRows
from .tree import branch_inputs
from .window import (
    Forward, Kept, RunningRow, StepPlan, WindowLayout, WindowState, feed_order, swap_in,
)


@dataclass
class StepSync:
    """What the host learned in a step's one read."""

    fed: int
    """The longest running window."""
    mask_columns: int
    """How many of the last fed columns hold mask slots in every running row."""
    running: list[RunningRow]
    """Indices (into the running rows) of the rows that go on."""
    cache_values: list[int]
    checks: list[int]
    branch_width: int = 0
    """The most branch tokens of a running row (`tree.py`): columns fed before the windows."""


def step_sync(
    state: WindowState,
    layout: WindowLayout,
    plan: StepPlan,
    kept: torch.Tensor | None,
    backend: ForwardBackend,
) -> StepSync:
    """The step's one host read: the next forward's width and mask columns, which rows still run, the sizes the
    backend needs to apply `kept` (the last forward's cache commit, if any) and the plan's checks."""
    done = state.done
    cache_values = backend.sync_values(kept) if kept is not None else []
    branches = [] if plan.branch_count is None else [plan.branch_count.sum(1).masked_fill(done, 0).max()]
    counted = [] if plan.fewest_filled is not None else [plan.filled.sum(1).masked_fill(done, layout.width).min()]
    summary = torch.stack([plan.length.masked_fill(done, 0).max(), *counted, *plan.checks, *branches])  # (bools
    host = torch.cat([summary, done, *(value.reshape(-1) for value in cache_values)]).tolist()  # read as 0 / 1)
    fed, fewest_filled = host[0], host[1] if counted else plan.fewest_filled
    first_check = 1 + len(counted)
    checks = host[first_check : first_check + len(plan.checks)]
    branch_width = host[first_check + len(plan.checks)] if branches else 0
    ended = host[len(summary) : len(summary) + done.shape[0]]
    values = host[len(summary) + done.shape[0] :]
    running = [row for row, end in enumerate(ended) if not end]
    return StepSync(fed, fed - fewest_filled, running, values, checks, branch_width)


def feed(
    state: WindowState, layout: WindowLayout, plan: StepPlan, sync: StepSync, backend: ForwardBackend,
    record: OutputRecord,
) -> Forward:
    """One forward over each row's first `plan.length` slots (the backend's width): filled slots first, mask slots
    last, dead slots (rows shorter than the longest) at the end; RoPE keeps each slot's logical position. Only the
    logits the policy needs are computed: the mask columns (physically last), or every column. The backend learns
    which of the mask columns hold each row's mask slots (none in a prompt, however its tokens read)."""
    fed, mask_columns = backend.shape(sync.fed, sync.mask_columns)
    keep = fed if plan.all_columns else mask_columns
    if fed == 1:  # one column per row (AR-only steps): every row's slot 0, already in feed order
        physical = layout.slots.expand(plan.length.shape[0], -1)
        fed_live = plan.length[:, None] > 0
        mask_slots = (fed_live & ~plan.filled[:, :1])[:, 1 - mask_columns :] if mask_columns else fed_live[:, :0]
        input_ids, position_ids = state.window[:, :1], (state.first_position + plan.start)[:, None]
    else:
        order, live = feed_order(plan.filled, layout, plan.length)
        physical, fed_order, fed_live = order.argsort(dim=1), order[:, :fed], live[:, :fed]
        mask_slots = (live & ~plan.filled).gather(1, fed_order[:, fed - mask_columns :])
        input_ids = state.window.gather(1, fed_order)
        position_ids = (state.first_position + plan.start)[:, None] + fed_order
    with_prompt, branch_width, window_mask = state.prompt is not None, sync.branch_width, None
    if with_prompt:
        input_ids = torch.cat([state.prompt, input_ids], dim=1)
        position_ids = torch.cat([state.prompt_positions, position_ids], dim=1)
        state.prompt = state.prompt_positions = None
    elif branch_width:  # a tree (tree.py): the branches' columns first, seen by none of the window's
        branch_ids, branch_positions, branch_live, window_mask = branch_inputs(plan, state, branch_width, fed)
        input_ids, position_ids = torch.cat([branch_ids, input_ids], 1), torch.cat([branch_positions, position_ids], 1)
        fed_live = torch.cat([branch_live, fed_live], dim=1)
        state.processed = state.processed + plan.branch_count.sum(1)
    # with the prompt, one more column: the last prompt token's logits, the AR prediction of the first new token
    before = int(with_prompt) + branch_width
    logits = backend.forward(input_ids, position_ids, fed_live, mask_slots, keep + before, window_mask)
    if layout.suppressed is not None:
        logits = logits.index_fill(-1, layout.suppressed, float("-inf"))
    record.steps += 1
    state.processed = state.processed + plan.length
    return Forward(
        logits=logits[:, logits.shape[1] - keep :],
        physical=physical - (fed - keep) if fed > keep else physical,
        prompt_logits=logits[:, 0] if with_prompt else None,
        fed=fed,
        mask_columns=mask_columns,
        branch_logits=logits[:, :branch_width] if branch_width else None,
    )


@dataclass
class RowProgress:
    """What one input row gained since the caller's last look (`DecodeLoop.progress`)."""

    tokens: list[int]
    finish_reason: str
    """Why it ended (generation/outputs.py), "" while it runs."""
    stats: WeDLMStats | None
    """Its statistics as a call of its own reports them, once it ended."""


class DecodeLoop:
    """The loop between two steps, so a caller can drive it step by step and let rows join or leave at a step
    boundary (continuous batching: the package's `continuous` scheduler); `run` drives it to the end.

    A step is `settle` (commit, the one host read, finished rows leave) then `advance` (the forward and the
    policy's update). Between the two, every row's commits are applied and its next forward is planned: the point
    where rows can join (`join`), report (`progress`), and be cancelled, handed to another backend or, once ended,
    forgotten (`rows`: `RunningRows`, rows.py, the one place rows join and leave).
    """

    def __init__(
        self, state: WindowState, layout: WindowLayout, record: OutputRecord, policy: StepPolicy,
        backend: ForwardBackend,
    ):
        self.layout = layout
        self.rows = RunningRows(state, record, policy, backend)
        self.sync: StepSync | None = None
        self.kept: Kept | None = None
        """Per row, the K/V of the last forward's window to keep; applied at the next sync."""

    @property
    def state(self) -> WindowState:
        return self.rows.state

    @property
    def record(self) -> OutputRecord:
        return self.rows.record

    def settle(self) -> list[RunningRow]:
        """Plan the next forward, read the host once, apply the last commit; return the indices (into the rows
        before) of the rows that go on, the others having left."""
        rows, kept = self.rows, self.kept
        rows.plan = plan = rows.policy.plan(rows.state)
        self.sync = sync = step_sync(rows.state, self.layout, plan, kept and kept.count, rows.backend)
        if kept is not None:
            rows.backend.commit(kept.count, sync.cache_values, kept.columns)
            self.kept = None
        if len(sync.running) < rows.count:
            rows.keep(sync.running)
        rows.policy.checked(sync.checks)
        return sync.running

    def advance(self) -> None:
        rows = self.rows
        forward = feed(rows.state, self.layout, rows.plan, self.sync, rows.backend, rows.record)
        self.kept = rows.policy.update(rows.state, rows.plan, forward)

    def join(self, other: "DecodeLoop") -> None:
        """Append `other`'s rows, settled after their first forward in a loop of their own over the same layout
        (`RunningRows.joined`), and size the next forward for both. Every joined value is built before any is set
        (`swap_in`), so a fault while joining leaves this loop as it was."""
        updates = self.rows.joined(other.rows)
        if other.rows.count > 0:
            if self.rows.count == 0:
                sync = other.sync
            else:  # the widest window and the fewest filled slots over both batches, as one sync over all reads them
                fewest_filled = min(self.sync.fed - self.sync.mask_columns, other.sync.fed - other.sync.mask_columns)
                fed = max(self.sync.fed, other.sync.fed)
                branch_width = max(self.sync.branch_width, other.sync.branch_width)
                sync = StepSync(fed, fed - fewest_filled, [], [], [], branch_width)
            updates.append((self, {"sync": sync}))
        swap_in(updates)

    @property
    def running(self) -> int:
        """How many rows are still decoding."""
        return self.rows.count

    def progress(self, reported: list[int]) -> list[RowProgress]:
        """Every input row's tokens committed after its first `reported[row]`, why it ended and its statistics
        once it has, for a caller reporting rows step by step: one host read, and one more per row that gained over
        a window."""
        record, width = self.record, self.layout.width
        generated = record.totals["generated"].clone()
        generated[self.state.rows] = self.state.generated
        known = torch.tensor(reported, dtype=torch.long, device=generated.device)
        columns = record.prompt_length + known[:, None] + self.layout.slots
        window = record.sequences.gather(1, columns.clamp(max=record.sequences.shape[1] - 1))
        host = torch.cat([generated, record.finish, window.flatten()]).tolist()
        rows, progress = len(reported), []
        for row, count in enumerate(reported):
            gained, start = host[row] - count, 2 * rows + row * width
            tokens = host[start : start + min(gained, width)]
            if gained > width:  # more than a window in one step: read the rest
                begin = record.prompt_length + count + width
                tokens += record.sequences[row, begin : begin + gained - width].tolist()
            reason = ENDED_BY[host[rows + row]]
            progress.append(RowProgress(tokens, reason, record.row_stats(row) if reason else None))
        return progress


def first_step(loop: DecodeLoop) -> bool:
    """The rows' first step (prompt and first window in one forward), settled: its commit applied, the rows it
    ended gone; whether any row goes on."""
    if not loop.settle():
        return False
    loop.advance()
    return bool(loop.settle())


def run(loop: DecodeLoop, then: ForwardBackend | None = None) -> None:
    """Decode until every row has ended; the output is in `loop.record`. With `then`, the rows move to that backend
    after their first step."""
    running = first_step(loop)
    if then is not None:
        loop.rows.hand_over(then)
    while running:
        loop.advance()
        running = loop.settle()
