"""What one `generate` call has produced so far: the output ids, per-token traces and scores, per-row totals, the
streamer and the step counter, with the commit rule (EOS, stopping criteria, max_new_tokens) that writes to them.

Everything here is indexed by *input* row (`WindowState.rows` maps running rows to it), so rows leaving the running
batch never move what is already recorded. Continuous batching appends rows (`joined`) and forgets reported ones
(`keep`) at step boundaries, and the loop remaps `WindowState.rows` then.
"""

import torch
from transformers import StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria
from transformers.generation.streamers import BaseStreamer

from .outputs import CANCELLED, ENDED_BY, EOS, LENGTH, STOP, WeDLMGenerateOutput, WeDLMStats
from .stopping import first_stop
from .window import InputRow, Updates, WindowLayout, WindowState

BASE_TOTALS = ("forwards", "generated", "processed")
"""Totals every decode reports (`WindowState.counters()` and the step count); a policy may add its own."""


class OutputRecord:
    def __init__(
        self,
        input_ids: torch.LongTensor,
        layout: WindowLayout,
        budgets: list[int],
        pad_id: int,
        eos_ids: torch.Tensor | None,
        stopping_criteria: StoppingCriteriaList,
        streamer: BaseStreamer | None,
        score_kinds: tuple[str, ...],
        vocab_size: int,
        policy_counters: tuple[str, ...] = (),
    ):
        batch_size, self.prompt_length = input_ids.shape
        device = input_ids.device
        self.layout = layout
        self.pad_id = pad_id
        self.eos_ids = eos_ids
        self.user_criteria = [c for c in stopping_criteria if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))]
        self.row_criteria: dict[int, list] = {}
        """Criteria of single input rows, besides `user_criteria` (continuous batching: each request's own)."""
        self.streamer = streamer
        self.budgets = budgets
        """Each input row's max_new_tokens: the output columns are as many as the largest needs, plus one."""
        self.discard = max(budgets, default=0)
        """One column past the output: dense writes aim every slot they do not commit there."""
        outputs = self.discard + 1
        self.sequences = torch.full((batch_size, self.prompt_length + outputs), pad_id, dtype=torch.long, device=device)
        self.sequences[:, : self.prompt_length] = input_ids
        self.fill_step = torch.zeros((batch_size, outputs), dtype=torch.long, device=device)
        self.commit_step = torch.zeros((batch_size, outputs), dtype=torch.long, device=device)
        self.token_scores = {kind: torch.zeros(batch_size, outputs, vocab_size, device=device) for kind in score_kinds}
        self.totals = {
            name: torch.zeros(batch_size, dtype=torch.long, device=device)
            for name in (*BASE_TOTALS, *policy_counters)
        }
        """Per input row: each counter's value when the row left (`forwards`: the step count then)."""
        self.finish = torch.zeros(batch_size, dtype=torch.long, device=device)
        """Per input row: why it ended, as an index into `ENDED_BY` (0 while it runs); written once, by `commit`."""
        self.first_step = torch.zeros(batch_size, dtype=torch.long, device=device)
        """Per input row: the model calls made before its first forward (0 but for rows that `join` later), so its
        statistics count from its own first forward."""
        self.steps = 0
        """Model calls so far (the live step number; the forward being prepared is `steps + 1`)."""
        self.sampling = None
        """Each input row's own sampling (`sampling.RowSampling`), or None: the call's processors decide."""

    @property
    def new_tokens(self) -> torch.Tensor:
        """A view of the generated columns: commits write through it."""
        return self.sequences[:, self.prompt_length :]

    def commit(self, state: WindowState, num_leading: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Write up to `num_leading` window slots from `start` to the output, cut after the first EOS or stopping
        criterion; return which rows this commit ends, recording why in `finish` (EOS, criterion or
        max_new_tokens). Ended rows commit nothing."""
        num_leading = num_leading.masked_fill(state.done, 0)
        finished = state.generated + num_leading >= state.max_new_tokens
        reason = torch.full_like(num_leading, ENDED_BY.index(LENGTH))
        commit_length = num_leading
        offset = self.layout.slots - start if start else self.layout.slots  # index within the commit
        if self.eos_ids is not None:
            in_commit = offset < num_leading[:, None]
            if start:
                in_commit &= offset >= 0
            is_eos = torch.isin(state.window, self.eos_ids) & in_commit
            has_eos = is_eos.any(1)
            commit_length = torch.where(has_eos, is_eos.int().argmax(1) + (1 - start), commit_length)
            reason = reason.masked_fill(has_eos, ENDED_BY.index(EOS))
            finished |= has_eos
        if self.user_criteria or self.row_criteria:
            cut, stopped = self._apply_user_criteria(state, commit_length, start)
            if self.eos_ids is not None:  # a criterion that fires on the EOS itself leaves the reason EOS
                stopped &= ~has_eos | (cut < commit_length)
            reason = reason.masked_fill(stopped, ENDED_BY.index(STOP))
            commit_length, finished = cut, finished | stopped
        self._finish_rows(state, finished, reason)
        self._write(state, commit_length, start, offset)
        return finished

    def commit_first(self, state: WindowState, none_done: bool = False) -> None:
        """`commit` of each running row's slot 0 alone (lossless mode's certain token, every step), ended rows marked
        done, in half the ops (the general commit for criteria, a streamer or kept scores); `none_done`: none ended."""
        if self.user_criteria or self.row_criteria or self.streamer is not None or self.token_scores:
            state.done |= self.commit(state, torch.ones_like(state.generated))
            return
        token, running = state.window[:, 0], None if none_done else ~state.done
        finished, reason = state.generated + 1 >= state.max_new_tokens, ENDED_BY.index(LENGTH)
        if self.eos_ids is not None:
            is_eos = torch.isin(token, self.eos_ids)
            finished |= is_eos
            reason = torch.where(is_eos, ENDED_BY.index(EOS), reason)
        finished = finished if running is None else finished & running
        # a running row's finish is 0 (finish and done are set together): adding the reason records it
        self.finish.index_put_((state.rows,), finished * reason, accumulate=True)
        position = state.generated if running is None else state.generated.masked_fill(state.done, self.discard)
        self.new_tokens[state.rows, position] = token
        self.fill_step[state.rows, position] = state.fill_step[:, 0]
        self.commit_step[state.rows, position] = self.steps + 1
        state.generated = state.generated + (1 if running is None else running)
        state.done = finished if running is None else state.done | finished

    def _finish_rows(self, state: WindowState, finished: torch.Tensor, reason: torch.Tensor | int) -> None:
        """Record why the rows `finished` ended (`reason`: an `ENDED_BY` index), unless they had already."""
        ending = finished & (self.finish[state.rows] == 0)
        self.finish[state.rows] = torch.where(ending, reason, self.finish[state.rows])

    def _write(self, state: WindowState, commit_length: torch.Tensor, start: int, offset: torch.Tensor) -> None:
        """Copy each row's `commit_length` slots from `start` (`offset`: each slot's index within the commit) to
        the output, with their traces and scores."""
        skip = offset >= commit_length[:, None]
        if start:
            skip |= offset < 0
        position = (state.generated[:, None] + offset).masked_fill(skip, self.discard)  # index among generated tokens
        rows = state.rows[:, None]
        self.new_tokens[rows, position] = state.window
        self.fill_step[rows, position] = state.fill_step
        self.commit_step[rows, position] = self.steps + 1
        for kind, store in self.token_scores.items():
            store[rows, position] = state.scores.kinds[kind]
        if self.streamer is not None:  # one put per token, as AR decoding does (consumers count puts)
            count, *tokens = torch.cat([commit_length[:1], state.window[0, start:]]).tolist()
            for token in tokens[:count]:
                self.streamer.put(torch.tensor([token]))
        state.generated = state.generated + commit_length

    def _apply_user_criteria(
        self, state: WindowState, commit_length: torch.Tensor, start: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cut each row's commit at the first token after which a user stopping criterion fires, as AR would: the
        commit is written to the row for `first_stop` to read, and a stopped row's cut tokens put back to padding."""
        stopped = torch.zeros_like(commit_length, dtype=torch.bool)
        cut = commit_length.clone()
        counts, generated = commit_length.tolist(), state.generated.tolist()
        for i, row in enumerate(state.rows.tolist()):
            criteria = self.user_criteria + self.row_criteria.get(row, [])
            if not criteria or not counts[i]:
                continue
            sequence, end, count = self.sequences[row], self.prompt_length + generated[i], counts[i]
            sequence[end : end + count] = state.window[i, start : start + count]
            first = first_stop(criteria, sequence, end, count)
            if first is not None:
                cut[i], stopped[i] = first + 1, True
                sequence[end + first + 1 : end + count] = self.pad_id
        return cut, stopped

    def committed_context(self, state: WindowState) -> torch.LongTensor:
        """Left-padded (rows, prompt + committed) ids: every row's context ends at its last committed token."""
        total = self.prompt_length + int(state.generated.max())
        ends = self.prompt_length + state.generated
        columns = torch.arange(total, device=state.window.device)[None, :] + (ends[:, None] - total)
        context = self.sequences[state.rows[:, None], columns.clamp(min=0)]
        return context.masked_fill(columns < 0, self.pad_id)

    def forward_numbers(self, state: WindowState) -> torch.Tensor:
        """Per running row, the number of the forward just run counted from the row's own first (the same whatever
        rows ran beside it: what a row's random draws are keyed on)."""
        return self.steps - self.first_step[state.rows]

    def store_totals(self, state: WindowState, counters: dict[str, torch.Tensor]) -> None:
        """Copy the running rows' counters into the per-input-row totals (before rows leave)."""
        self.totals["forwards"][state.rows] = self.steps  # every row runs from the first forward
        for name, value in counters.items():
            self.totals[name][state.rows] = value

    def joined(self, other: "OutputRecord") -> Updates:
        """`other`'s rows appended (continuous batching: requests ran their first forward in a record of their own,
        over the same layout), built without touching this record (`swap_in` sets them). Prompts stay
        right-aligned, to the longer prompt length of the two, and outputs as wide as the larger budget needs;
        `other`'s forward numbers move into this record's count, and its rows' statistics still count from their
        own first forward."""
        offset = self.steps - other.steps
        prompt_length, discard = max(self.prompt_length, other.prompt_length), max(self.discard, other.discard)
        first_row = self.sequences.shape[0]
        row_criteria = dict(self.row_criteria)
        for row in range(other.sequences.shape[0]):
            criteria = other.user_criteria + other.row_criteria.get(row, [])
            if criteria:  # an empty entry would still send every commit through the per-row criteria check
                row_criteria[first_row + row] = criteria
        return [(self, {
            "sequences": torch.cat([self._widened(prompt_length, discard), other._widened(prompt_length, discard)]),
            "prompt_length": prompt_length,
            "budgets": self.budgets + other.budgets,
            "discard": discard,
            "fill_step": _joined_columns(self.fill_step, other.fill_step + offset, discard + 1),
            "commit_step": _joined_columns(self.commit_step, other.commit_step + offset, discard + 1),
            "token_scores": {
                kind: _joined_columns(store, other.token_scores[kind], discard + 1)
                for kind, store in self.token_scores.items()
            },
            "totals": {
                name: torch.cat([total, other.totals[name] + (offset if name == "forwards" else 0)])
                for name, total in self.totals.items()
            },
            "finish": torch.cat([self.finish, other.finish]),
            "first_step": torch.cat([self.first_step, other.first_step + offset]),
            "row_criteria": row_criteria,
        })] + (self.sampling.joined(other.sampling) if self.sampling is not None else [])

    def _widened(self, prompt_length: int, discard: int) -> torch.Tensor:
        """`sequences` with padding prepended, so the prompt columns are `prompt_length` wide, and appended, so the
        output columns are `discard + 1`."""
        rows = self.sequences.shape[0]
        before = self.sequences.new_full((rows, prompt_length - self.prompt_length), self.pad_id)
        after = self.sequences.new_full((rows, discard - self.discard), self.pad_id)
        return torch.cat([before, self.sequences, after], dim=1)

    def keep(self, rows: list[InputRow]) -> torch.Tensor:
        """Forget every input row but `rows` (continuous batching: ended rows, once reported), the output columns
        narrowed to the kept rows' largest budget; returns each former row's new index, -1 for a forgotten one."""
        index = torch.tensor(rows, dtype=torch.long, device=self.sequences.device)
        moved = torch.full((self.sequences.shape[0],), -1, dtype=torch.long, device=index.device)
        moved[index] = torch.arange(len(rows), device=index.device)
        self.budgets = [self.budgets[row] for row in rows]
        self.discard = max(self.budgets, default=0)
        outputs = self.discard + 1
        self.sequences = self.sequences[index, : self.prompt_length + outputs]
        self.finish, self.first_step = self.finish[index], self.first_step[index]
        self.fill_step, self.commit_step = self.fill_step[index, :outputs], self.commit_step[index, :outputs]
        self.token_scores = {kind: store[index, :outputs] for kind, store in self.token_scores.items()}
        self.totals = {name: total[index] for name, total in self.totals.items()}
        self.row_criteria = {new: self.row_criteria[old] for new, old in enumerate(rows) if old in self.row_criteria}
        if self.sampling is not None:
            self.sampling.keep(rows)
        return moved

    def cancel(self, rows: torch.Tensor) -> None:
        """Record input rows `rows` as cancelled (unless they ended already)."""
        running = self.finish[rows] == 0
        self.finish[rows] = torch.where(running, ENDED_BY.index(CANCELLED), self.finish[rows])

    def row_stats(self, row: int) -> WeDLMStats:
        """Input row `row`'s statistics as a call of its own reports them (numbered from its first forward)."""
        first_step = int(self.first_step[row])
        forwards = int(self.totals["forwards"][row]) - first_step
        return self._stats([row], first_step, model_calls=forwards)

    def output(self, return_dict: bool) -> WeDLMGenerateOutput | torch.LongTensor:
        """The `generate` result: the sequences cut to the longest row, or with scores, logits and statistics."""
        generated = self.totals["generated"].tolist()
        longest = max(generated, default=0)
        sequences = self.sequences[:, : self.prompt_length + longest]
        if not return_dict:
            return sequences
        per_token = {kind: tuple(store[:, t] for t in range(longest)) for kind, store in self.token_scores.items()}
        return WeDLMGenerateOutput(
            sequences=sequences, scores=per_token.get("scores"), logits=per_token.get("logits"),
            wedlm_stats=self._stats(list(range(len(generated))), 0, self.steps),
        )

    def _stats(self, rows: list[int], first_step: int, model_calls: int) -> WeDLMStats:
        """Counters of `rows`, with each row's per-token trace: the forward that filled each token and the one that
        committed it (numbered after `first_step`)."""
        totals = {name: total[rows].tolist() for name, total in self.totals.items()}
        totals["forwards"] = [forwards - first_step for forwards in totals["forwards"]]
        extra = {name: value for name, value in totals.items() if name not in BASE_TOTALS}
        traces = {
            name: [(steps[row, :count] - first_step).tolist() for row, count in zip(rows, totals["generated"])]
            for name, steps in (("fill_steps", self.fill_step), ("commit_steps", self.commit_step))
        }
        return WeDLMStats(
            forwards=totals["forwards"],
            generated=totals["generated"],
            processed=totals["processed"],
            model_calls=model_calls,
            finish_reasons=[ENDED_BY[code] for code in self.finish[rows].tolist()],
            **traces,
            **extra,
        )


def _joined_columns(mine: torch.Tensor, theirs: torch.Tensor, columns: int) -> torch.Tensor:
    """Two (rows, columns[, ...]) tensors stacked, each padded with zeros on the right to `columns` columns."""
    def padded(values: torch.Tensor) -> torch.Tensor:
        shape = (values.shape[0], columns - values.shape[1], *values.shape[2:])
        return torch.cat([values, values.new_zeros(shape)], dim=1)

    return torch.cat([padded(mine), padded(theirs)])
