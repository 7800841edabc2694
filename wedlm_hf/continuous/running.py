"""`RunningRequests`: the one place requests join and leave the running batch.

The engine has three index spaces: requests (their ids), input rows (a request's row of the running batch's output
record, `Sequence.row`) and running rows (where a row decodes among those still decoding, inside the decoding
loop: generation/rows.py). Admission, a report of ended requests, a cancellation and a failure each move a request's
record (`Sequence`) and its row together, here, so no other code keeps a list parallel to the batch's rows, and a
request's row is renumbered in one loop when the rows before it are forgotten.
"""

from collections.abc import Iterator

from ..generation.outputs import ERROR
from ..generation.window import InputRow
from .batch import RunningBatch
from .requests import GenerationRequest, RequestUpdate, error_update
from .sequence import NO_ROW, Sequence


class RunningRequests:
    def __init__(self, batch: RunningBatch):
        self.batch = batch
        self.sequences: list[Sequence] = []
        """The running requests' records, in input-row order: a record's `row` is its index here."""

    def __len__(self) -> int:
        return len(self.sequences)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self.sequences)

    def requests(self) -> list[GenerationRequest]:
        return [sequence.request for sequence in self.sequences]

    def admit(self, group: list[GenerationRequest]) -> None:
        """Prefill `group` and join its rows to the running batch, each request's record after the held ones; a
        fault leaves the running requests as they were (`RunningBatch.start`)."""
        sequences = [Sequence(request, request.sampling or self.batch.default_sampling) for request in group]
        self.batch.start(sequences)
        for sequence in sequences:
            sequence.row = InputRow(len(self.sequences))
            sequence.blocks = self.batch.blocks(sequence.row)
            self.sequences.append(sequence)

    def cancel(self, request_ids: set[str]) -> None:
        """End the running requests `request_ids` now: their rows leave the batch, and the next report says so."""
        rows = [sequence.row for sequence in self.sequences if sequence.request_id in request_ids]
        if rows:
            self.batch.cancel(rows)

    def report(self) -> list[RequestUpdate]:
        """Each running request's new tokens, as the loop hands them back, and the ended ones' results (their finish
        reason as the loop recorded it); ended requests then leave, their prompt and output kept for drafting where
        the batch keeps a history."""
        updates, ended = [], []
        reported = [len(sequence.tokens) for sequence in self.sequences]
        for sequence, progress in zip(self.sequences, self.batch.progress(reported)):
            sequence.tokens += progress.tokens
            result = None
            if progress.finish_reason:
                sequence.finish_reason = progress.finish_reason
                result = sequence.result(progress.stats)
                ended.append(sequence.row)
                if self.batch.history is not None:
                    self.batch.history.add(sequence.prompt_ids, sequence.tokens)
            if progress.tokens or result is not None:
                updates.append(RequestUpdate(sequence.request_id, progress.tokens, result))
        if ended:
            self._leave(ended)
        return updates

    def fail(self, rows: list[InputRow], error: Exception) -> list[RequestUpdate]:
        """Fail the requests of rows `rows` alone: they leave the batch, and their rows are forgotten."""
        self.batch.cancel(rows)
        failed = [self._failed(self.sequences[row], error) for row in rows]
        self._leave(rows)
        return failed

    def fail_all(self, error: Exception) -> list[RequestUpdate]:
        """Fail every running request (a fault in a shared step: no row's state can be trusted) and drop the rows."""
        failed = [self._failed(sequence, error) for sequence in self.sequences]
        self.sequences = []
        self.batch.clear()
        return failed

    def _failed(self, sequence: Sequence, error: Exception) -> RequestUpdate:
        sequence.finish_reason, sequence.row, sequence.blocks = ERROR, NO_ROW, []
        return error_update(sequence.request_id, error)

    def _leave(self, rows: list[InputRow]) -> None:
        """Ended rows `rows` are forgotten by the batch and their records dropped; the later ones move up."""
        self.batch.forget(rows)
        gone = set(rows)
        for sequence in self.sequences:
            if sequence.row in gone:
                sequence.row, sequence.blocks = NO_ROW, []
        self.sequences = [sequence for sequence in self.sequences if sequence.row != NO_ROW]
        for row, sequence in enumerate(self.sequences):
            sequence.row = InputRow(row)
