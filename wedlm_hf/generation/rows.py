"""`RunningRows`: the one place rows join and leave the decoding loop, and the one map between its index spaces.

A decode holds per-row state in several containers: the window state, the step plan in flight, the step
policy's own (lossless mode's drafts, schedule, branches), the backend's K/V (a growing cache, or blocks of the
pool), and the output record. Each container keeps its rows as the first dimension of its tensors and knows how to
keep some of them and append another's (`RowMember`); which rows run, and where each one's output is, is decided
here alone, so no caller selects containers one by one and a new container is one more member, not one more call
in every place rows move.

Two index spaces meet here: input rows (`InputRow`, the output record's rows, fixed while a row is held) and
running rows (`RunningRow`, the first dimension of every hot tensor, which moves as rows before it leave).
`WindowState.rows` maps the second to the first on the device, for the step's gathers; `input_rows` is the same map
on the host, kept in step with it, so moving rows never reads the device.
"""

from dataclasses import replace
import torch

from .protocols import ForwardBackend, RowMember, StepPolicy
from .record import OutputRecord
from .window import InputRow, RunningRow, StepPlan, Updates, WindowState, swap_in


class RunningRows:
    """The rows of one decode: their record, window state, policy, backend and the plan of the step in flight.

    `keep`, `joined`, `hand_over`, `cancel` and `forget` are every way rows leave, join or move; each updates every
    member together. The backend is the member that also keeps host lists per row (the pool's blocks and ends), so
    it is handed the kept rows as a host list besides the device index."""

    def __init__(self, state: WindowState, record: OutputRecord, policy: StepPolicy, backend: ForwardBackend):
        self.state, self.record, self.policy, self.backend = state, record, policy, backend
        self.plan: StepPlan | None = None
        """The plan of the step in flight (set by the loop between a plan and its forward)."""
        self.input_rows = [InputRow(row) for row in range(state.rows.shape[0])]
        """Each running row's input row, on the host (`WindowState.rows` on the device): a new decode's rows are its
        input rows, in order."""

    @property
    def count(self) -> int:
        """How many rows are still decoding."""
        return len(self.input_rows)

    @property
    def held(self) -> int:
        """Input rows held: decoding, or ended and not yet forgotten."""
        return self.record.sequences.shape[0]

    def members(self) -> list[RowMember]:
        """Every container of per-row device state but the backend's."""
        return [self.state, self.policy] + ([self.plan] if self.plan is not None else [])

    def running_row(self, row: InputRow) -> RunningRow | None:
        """Where input row `row` decodes now; None once it ended."""
        return RunningRow(self.input_rows.index(row)) if row in self.input_rows else None

    def keep(self, kept: list[RunningRow]) -> None:
        """Only running rows `kept` go on (the others finished, or were dropped); their totals are recorded first."""
        self.record.store_totals(self.state, {**self.state.counters(), **self.policy.counters()})
        index = torch.tensor(kept, dtype=torch.long, device=self.state.rows.device)
        for member in self.members():
            member.select_rows(index)
        self.backend.select_rows(index, kept)
        self.input_rows = [self.input_rows[row] for row in kept]

    def joined(self, other: "RunningRows") -> Updates:
        """`other`'s rows appended, settled after their first forward over the same layout: its record's rows after
        this record's, its running rows after these. Built without touching any member (`swap_in` sets them)."""
        first_row, offset = self.held, self.record.steps - other.record.steps
        updates = self.record.joined(other.record)
        if other.count == 0:  # rows that all ended in their first step join only the record
            return updates
        # their input rows follow this record's, their forward numbers move into this record's count
        theirs = replace(other.state, rows=other.state.rows + first_row, fill_step=other.state.fill_step + offset)
        return updates + [
            *self.state.joined_rows(theirs),
            *self.plan.joined_rows(other.plan),
            *self.policy.joined_rows(other.policy),
            *self.backend.joined_rows(other.backend),
            (self, {"input_rows": self.input_rows + [first_row + row for row in other.input_rows]}),
        ]

    def hand_over(self, backend: ForwardBackend) -> None:
        """Move the running rows to `backend` (which runs none yet): their K/V copied in, then it is theirs."""
        swap_in(backend.joined_rows(self.backend))
        self.backend = backend

    def cancel(self, rows: list[InputRow]) -> None:
        """End input rows `rows` now (a client cancelled them, or they failed): recorded as cancelled, they leave.
        The planned forward stays as wide as the rows before: wider than needed, which only feeds dead slots."""
        self.record.cancel(torch.tensor(rows, dtype=torch.long, device=self.state.rows.device))
        gone = set(rows)
        self.keep([RunningRow(i) for i, row in enumerate(self.input_rows) if row not in gone])

    def forget(self, rows: list[InputRow]) -> None:
        """Drop ended input rows `rows` from the record (their output was read): the later rows move up."""
        gone = set(rows)
        kept = [row for row in range(self.held) if row not in gone]
        moved = self.record.keep(kept)
        self.state.rows = moved[self.state.rows]
        new_row = {old: InputRow(new) for new, old in enumerate(kept)}
        self.input_rows = [new_row[row] for row in self.input_rows]
