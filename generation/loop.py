"""The decoding loop: one host sync per step, then the policy's and the backend's calls, top to bottom.

    plan    = policy.plan(state)           commit what the last forward settled; size the next forward
    sync    = step_sync(...)               the one host read: width, mask columns, running rows, cache sizes
    backend.commit / rows leave            apply the last forward's cache commit; finished rows leave
    forward = feed(...)                    the window forward (filled slots first, masks last)
    kept    = policy.update(...)           shift, fill, verify; the K/V the cache keeps, applied at the next sync

Policies (plain.py, lossless.py) and backends (dynamic.py, static.py) are objects handed to `run`, as
transformers' assisted-decoding loop is handed a candidate generator; a new one implements the Protocol below.
"""

from dataclasses import dataclass
from typing import Protocol

import torch

from .record import OutputRecord
from .window import Forward, StepPlan, WindowLayout, WindowState, feed_order


class StepPolicy(Protocol):
    counter_names: tuple[str, ...]
    """Names of the per-row counters `counters()` reports, besides the window state's own."""

    def plan(self, state: WindowState) -> StepPlan: ...

    def checked(self, values: list[int]) -> None:
        """Act on the values of `StepPlan.checks`, read in the sync (e.g. raise)."""

    def update(self, state: WindowState, plan: StepPlan, forward: Forward) -> torch.Tensor:
        """Consume the forward; return per row how many K/V of its window the cache keeps."""

    def select_rows(self, index: torch.Tensor) -> None: ...

    def counters(self) -> dict[str, torch.Tensor]: ...


class ForwardBackend(Protocol):
    def shape(self, fed: int, mask_columns: int) -> tuple[int, int]:
        """The width a forward feeds and the mask columns in it, from the sync's values."""

    def sync_values(self, committed: torch.Tensor) -> list[torch.Tensor]:
        """0-dim tensors `commit` needs, read in the step sync."""

    def commit(self, committed: torch.Tensor, values: list[int]) -> None: ...

    def select_rows(self, index: torch.Tensor) -> None: ...

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, window_live: torch.Tensor, logits_to_keep: int
    ) -> torch.Tensor: ...


@dataclass
class StepSync:
    """What the host learned in a step's one read."""

    fed: int
    """The longest running window."""
    mask_columns: int
    """How many of the last fed columns hold mask slots in every running row."""
    running: list[int]
    """Indices (into the running rows) of the rows that go on."""
    cache_values: list[int]
    checks: list[int]


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
    summary = torch.stack(
        [
            plan.length.masked_fill(done, 0).max(),
            plan.filled.sum(1).masked_fill(done, layout.width).min(),
            *cache_values,
            *(check.long() for check in plan.checks),
        ]
    )
    host = torch.cat([summary, done.long()]).tolist()
    fed, fewest_filled = host[:2]
    values = host[2 : 2 + len(cache_values)]
    checks = host[2 + len(cache_values) : 2 + len(cache_values) + len(plan.checks)]
    ended = host[2 + len(cache_values) + len(plan.checks) :]
    return StepSync(fed, fed - fewest_filled, [row for row, end in enumerate(ended) if not end], values, checks)


def feed(
    state: WindowState,
    layout: WindowLayout,
    plan: StepPlan,
    sync: StepSync,
    backend: ForwardBackend,
    record: OutputRecord,
) -> Forward:
    """One forward over each row's first `plan.length` slots (the backend's width): filled slots first, mask slots
    last, dead slots (rows shorter than the longest) at the end; RoPE keeps each slot's logical position. Only the
    logits the policy needs are computed: the mask columns (physically last), or every column."""
    fed, mask_columns = backend.shape(sync.fed, sync.mask_columns)
    keep = fed if plan.all_columns else mask_columns
    order, live = feed_order(plan.filled, layout, plan.length)
    fed_order = order[:, :fed]
    input_ids = state.window.gather(1, fed_order)
    position_ids = (state.first_position + plan.start)[:, None] + fed_order
    fed_live = live[:, :fed]
    with_prompt = state.prompt is not None
    if with_prompt:
        input_ids = torch.cat([state.prompt, input_ids], dim=1)
        position_ids = torch.cat([state.prompt_positions, position_ids], dim=1)
        state.prompt = state.prompt_positions = None
    # with the prompt, one more column: the last prompt token's logits, the AR prediction of the first new token
    logits = backend.forward(input_ids, position_ids, fed_live, logits_to_keep=keep + int(with_prompt))
    if layout.suppressed is not None:
        logits = logits.index_fill(-1, layout.suppressed, float("-inf"))
    record.steps += 1
    state.processed = state.processed + plan.length
    return Forward(
        logits=logits[:, logits.shape[1] - keep :],
        physical=order.argsort(dim=1) - (fed - keep),
        prompt_logits=logits[:, 0] if with_prompt else None,
        fed=fed,
        mask_columns=mask_columns,
    )


def run(
    state: WindowState, layout: WindowLayout, record: OutputRecord, policy: StepPolicy, backend: ForwardBackend
) -> None:
    """Decode until every row has ended; the output is in `record`."""
    kept = None  # per row, the K/V of the last forward's window to keep; applied at the next sync
    while True:
        plan = policy.plan(state)
        sync = step_sync(state, layout, plan, kept, backend)
        if kept is not None:
            backend.commit(kept, sync.cache_values)
        if len(sync.running) < state.rows.shape[0]:  # rows leave: record their totals first
            record.store_totals(state, {**state.counters(), **policy.counters()})
            if not sync.running:
                return
            index = torch.tensor(sync.running, device=state.rows.device)
            state.select(index)
            plan.select(index)
            policy.select_rows(index)
            backend.select_rows(index)
        policy.checked(sync.checks)
        forward = feed(state, layout, plan, sync, backend, record)
        kept = policy.update(state, plan, forward)
