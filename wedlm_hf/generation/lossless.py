"""Lossless WeDLM: parallel drafts verified by the same forward, so the output is exactly the model's AR decoding.

Causal attention makes verification free. The committed prefix ends in one *certain* token c (the AR choice),
fed first in every window, followed by the leading drafted slots in logical order; the logits at c and at each
leading draft are therefore ordinary next-token logits. They are verified as `generate()` would decide there
(`verify.py`: the call's logits processors with each position's exact prefix, then greedy or speculative
sampling). A draft is committed only while it passes; at the first failure the verified token takes its place as
the next certain token and every slot after it returns to MASK (its prediction saw the wrong token). If all
leading drafts pass, the logits of the last one give the next certain token for free. Each forward thus commits
at least one token, and the committed tokens are the model's AR continuation by construction (greedy: token for
token; sampling: in distribution).

The first forward feeds the prompt with the first window and has no certain token yet: the prompt's last token's
logits give the first one. With prompt lookup, a row whose prompt's last n-gram occurred before (in it, or in the
history) drafts its continuation into slots 0 on, verified there as later drafts are: the ones that pass are
committed, the token after them is the first certain one, and the mask predictions draft only if none failed.

New drafts come only from predictions that saw verified tokens: after a correction the row drafts nothing until
the next forward, which predicts its masks from the corrected prefix. (Drafting from the same forward would use
predictions conditioned on the rejected token, and a rejected slot's logits predict the slot after it; on the
embedded checkpoint's counting prompts, drafting at threshold 1.0, that gave 6.5 tokens per forward, not 10.3.)

The policy only coordinates parts, each asked at a fixed point of the step: plan -> forward -> check
(`verification.py`: one `Verdict`) -> commit (here) -> schedule (`draft_schedule.py`) -> draft (`draft_source.py`:
the window's mask predictions, then prompt lookup, `lookup_drafts.py`, or any other source handed in).
"""

import torch

from .draft_schedule import DraftSchedule
from .draft_source import AfterCommit, DraftSource, MaskPredictions
from .draft_state import DraftState, MaskTokenPredicted
from .fill import SlotFiller, gather_columns
from .lookup import PromptLookup
from .lookup_drafts import LookupBranches, LookupChain
from .record import OutputRecord
from .tree import plan_fields
from .verification import ChainCheck, TreeCheck, Verdict
from .verify import Verifier
from .window import Forward, Kept, StepPlan, Updates, WindowLayout, WindowState, leading_filled, shift


class LosslessPolicy:
    """AR decoding by verification. Per row, `draft_limit` bounds the drafts a forward checks: a window of
    `draft_limit + 2` slots, as `wedlm_draft_schedule="adaptive"` sets it (`draft_schedule.py`); `"full"` drafts
    every slot of a `window_size` window, always. With prompt lookup (`lookup_drafts.py`), a row whose slot after
    the certain token holds no mask prediction takes the context's continuation there, whatever its `draft_limit`:
    such a draft costs no forward of its own; before the first forward, every row with a match takes it in slots 0
    on (the prefill verifies them). With `tree`, every later step verifies each row's lookup drafts beside its
    window's (`tree.py`). `sources` are further draft sources, asked after prompt lookup.
    """

    counter_names = ("drafted", "accepted", "corrected")

    def __init__(
        self, layout: WindowLayout, record: OutputRecord, filler: SlotFiller, state: WindowState, adaptive: bool,
        verifier: Verifier, lookup: PromptLookup | None = None, trained: bool = True, tree: bool = False,
        sources: tuple[DraftSource, ...] = (), beside: int = 0,
    ):
        self.layout, self.record, self.trained, length = layout, record, trained, state.length
        self.drafts = DraftState(
            drafted=torch.zeros_like(length), accepted=torch.zeros_like(length), corrected=torch.zeros_like(length),
            mask_predicted=torch.zeros_like(state.done),
        )
        self.schedule = (
            DraftSchedule.starting(state.generated, trained, filler.settings, record.sampling, beside)
            if adaptive else None
        )
        """The adaptive schedule's row state (None: `"full"`, every window `window_size` slots)."""
        self.predictions = MaskPredictions(layout, filler)
        """The window's own drafts, drawn before the schedule (which weighs them)."""
        branches = LookupBranches(lookup, record, layout, state) if tree and lookup else None
        lookups = [] if lookup is None else [branches or LookupChain(lookup, record, layout, state, self.schedule)]
        self.sources: tuple[DraftSource, ...] = (*lookups, *sources)
        """The sources asked after the schedule, in order."""
        self.branch = None if branches is None else branches.branch
        """With trees: each row's lookup branches, verified beside its window."""
        first_drafts = max((source.first_slots for source in self.sources), default=0)
        self.check = (
            ChainCheck(verifier, layout, first_drafts) if branches is None
            else TreeCheck(verifier, layout, first_drafts, self.branch)
        )
        """The check after each forward: the window's chain, or with trees its branches too."""
        self.draft_probs: torch.Tensor | None = None
        """Sampling: (rows, window_size, vocab) the distribution q each draft was drawn from (drafts live in the
        first `window_size` slots), allocated at the first forward."""
        self.started = False
        """Whether the first forward ran: it has no certain token yet, only the prompt's AR prediction."""
        self.certain_only = False
        """Whether every window is its certain token then masks (an AR-only forward leaves it so, with no source
        that drafts from the context)."""
        self._limit_window(state)

    def plan(self, state: WindowState) -> StepPlan:
        if not self.started:  # the sources draft from the prompt (slots 0 on), checked by the first forward too
            for source in self.sources:
                source.first(state)
            filled, leading = leading_filled(state, self.layout)
            length = torch.minimum(state.length + leading, state.max_new_tokens - state.generated)
            return StepPlan(length, state.generated, filled, leading, all_columns=self.check.first_drafts > 0,
                            **plan_fields(self.branch))
        # 1. the certain token is committed now (its K/V come from the forward below); 2. one forward: next-token
        #    logits at the certain token and at every leading draft, plus as many extra mask slots as there are
        #    drafts, so that if all are accepted the next window is already predicted
        start, fewest_filled = state.generated, None
        if self.certain_only:  # every window is its certain token, then masks: nothing to scan, no draft to add
            filled, leading = self.layout.slot_zero_only(start.shape[0])
            length, fewest_filled = state.length, 1  # (length: set within each row's budget by the last update)
        else:
            filled, leading = leading_filled(state, self.layout)
            length = torch.minimum(state.length + (leading - 1), state.max_new_tokens - start)
        self.record.commit_first(state, none_done=self.certain_only)  # (an AR-only update ends no row)
        self.mask_check = (self.drafts.mask_predicted, state.rows)  # (which rows, read only if the check fails)
        return StepPlan(length, start, filled, leading, all_columns=True, checks=(self.drafts.mask_predicted.any(),),
                        fewest_filled=fewest_filled, **plan_fields(self.branch))

    def checked(self, values: list[int]) -> None:
        if values and values[0]:
            predicted, rows = self.mask_check
            raise MaskTokenPredicted(rows[predicted].tolist())

    def update(self, state: WindowState, plan: StepPlan, forward: Forward) -> Kept:
        """Check, commit, schedule and draft from this forward; returns the K/V per row the cache keeps."""
        if not self.started:
            return self._first_update(state, plan, forward)
        if forward.fed == 1 and not state.scores.kinds and forward.branch_logits is None:
            return self._ar_only_update(state, plan, forward)
        self.certain_only = False
        verdict = self.check.after(state, plan, forward, self.draft_probs)
        slot_physical, corrected = self._commit(state, plan, forward, verdict)
        # new drafts from this forward's mask predictions, whose logits are the last `mask_columns`
        fed, masks = forward.fed, forward.mask_columns
        after = AfterCommit(verdict.accepted, corrected, self.draft_probs)
        if masks:
            after.logits, after.slot_physical = forward.logits[:, fed - masks :], slot_physical - (fed - masks)
        self.predictions.draft(state, after)
        if self.schedule is not None and fed == 1:  # no window checked a draft (a tree's were its branches')
            self.schedule.probe(self.schedule.draft_limit, state.generated)
        elif self.schedule is not None:  # the limit follows the mask predictions' drafts only
            drafts, accepted, in_chain = verdict.drafts, verdict.accepted, self._from_sources()
            if in_chain is not None:
                mask_drafted = ~in_chain
                drafts, accepted, corrected = drafts * mask_drafted, accepted * mask_drafted, corrected & mask_drafted
            self.schedule.adapt(drafts, accepted, corrected, state.generated, self.drafts.accepted)
        self._limit_window(state)
        self._draft_from_sources(state, after)
        return Kept(1 + verdict.committed, verdict.branch_columns)

    def _first_update(self, state: WindowState, plan: StepPlan, forward: Forward) -> Kept:
        """`update` after the first forward, which has no certain token yet: the prompt's AR prediction decides, at
        the sources' drafts of slots 0 on first; the accepted ones are committed (their K/V kept), the token after
        them becomes certain, and the mask predictions fill the slots after it unless a draft failed (they saw
        it). Rows with no drafts commit nothing here: slot 0 gets the prompt's prediction."""
        self.started, verifier = True, self.check.verifier
        if verifier.do_sample:
            shape = (state.window.shape[0], self.layout.window_size, forward.logits.shape[-1])
            self.draft_probs = torch.zeros(shape, device=forward.logits.device)
        verdict = self.check.first(state, plan, forward)
        slot_physical, corrected = self._commit(state, plan, forward, verdict)
        after = AfterCommit(verdict.accepted, corrected, self.draft_probs, forward.logits, slot_physical,
                            with_entropy=self.schedule is not None)
        self.predictions.draft(state, after)
        greedy = verifier.greedy_rows(state)  # (sampled drafts pass by p/q: no cut for those)
        if self.schedule is not None and self.trained and greedy is not None and after.entropy is not None:
            self.schedule.first_window(after.entropy[:, 1:], self.predictions.filler.settings.entropy_threshold,
                                       greedy & ~corrected)
        self._limit_window(state)
        self._draft_from_sources(state, after)
        return Kept(verdict.accepted)

    def _commit(
        self, state: WindowState, plan: StepPlan, forward: Forward, verdict: Verdict
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The verdict applied: the committed slots from `verdict.start` on go to the output, each with the logits
        and scores of the position before it; the window moves past them, a row that rejected a draft returns its
        drafts to MASK, and the next certain token takes slot 0. Returns each slot's fed column after the move, and
        which rows rejected a draft (a row whose branch extends all its drafts keeps the predictions past it)."""
        start, committed, accepted, raw, scores = (
            verdict.start, verdict.committed, verdict.accepted, verdict.raw, verdict.scores
        )
        counts, corrected = self.drafts, accepted < plan.leading - start  # (the drafts from slot `start` on)
        counts.drafted, counts.accepted = counts.drafted + verdict.checked, counts.accepted + committed
        counts.corrected = counts.corrected + corrected
        if state.scores.kinds:
            width = raw.shape[1] - 1
            state.scores.place(slice(start, start + width), raw[:, :width], scores[:, :width])
        if verdict.commit:
            state.done |= self.record.commit(state, committed, start=start)
        certain = [None if values is None else gather_columns(values, accepted[:, None]) for values in (raw, scores)]
        slot_physical = shift(state, self.layout, start + committed, plan.length, forward.physical)
        if self.draft_probs is not None:  # (a slot coming from past the window is a mask: its q is never read)
            source = (self.layout.slots[:, : self.draft_probs.shape[1]] + (start + committed)[:, None])
            source = source.clamp(max=self.draft_probs.shape[1] - 1)[..., None].expand_as(self.draft_probs)
            self.draft_probs = self.draft_probs.gather(1, source)
        state.window = state.window.masked_fill(corrected[:, None] & (self.layout.slots >= 1), self.layout.mask_id)
        self._place_certain(state, verdict.next_certain, *certain)
        return slot_physical, corrected

    def _ar_only_update(self, state: WindowState, plan: StepPlan, forward: Forward) -> Kept:
        """`update` after a forward of one column per row (every window is the certain token alone): its chosen
        token is the next certain token, written over slot 0 (the slots after it hold masks, whose draft
        distributions are never read); nothing to verify, count, fill or shift. The general path's result in far
        fewer ops: most lossless forwards are of this kind where drafts fail."""
        one = self.layout.slot_zero_only(plan.length.shape[0])[1]
        self._place_certain(state, self.check.next_certain(state, forward, one), None, None)
        if self.schedule is not None:
            self.schedule.probe(self.schedule.draft_limit, state.generated)
        state.length = self._window_length(state)  # at least 1: a row with no budget left ended at the commit
        self.certain_only = not self.sources  # (a source may draft after the certain token now)
        self._draft_from_sources(state, AfterCommit(None, None, self.draft_probs))
        return Kept(one)

    def _draft_from_sources(self, state: WindowState, after: AfterCommit) -> None:
        """Every source after the schedule drafts, in order, into what the window leaves empty."""
        for source in self.sources:
            source.draft(state, after)

    def _from_sources(self) -> torch.Tensor | None:
        """Rows whose window drafts a source other than the mask predictions placed (None: no source can)."""
        rows = None
        for source in self.sources:
            if source.in_chain is not None:
                rows = source.in_chain if rows is None else rows | source.in_chain
        return rows

    def _place_certain(
        self, state: WindowState, tokens: torch.Tensor, logits: torch.Tensor | None, scores: torch.Tensor | None
    ) -> None:
        """Slot 0 gets the verified token, with the (rows, 1, vocab) logits and scores it was chosen from."""
        self.drafts.mask_predicted = tokens == self.layout.mask_id  # (the last plan's check found none before)
        state.window[:, 0] = tokens
        state.fill_step[:, 0].fill_(self.record.steps)  # (no scalar tensor made, as assignment makes one)
        if logits is not None and state.scores.kinds:
            state.scores.place(slice(0, 1), logits, scores)

    def _window_length(self, state: WindowState) -> torch.Tensor:
        budget = state.max_new_tokens - state.generated
        if self.schedule is not None:
            return self.schedule.window_length(budget, self.layout.window_size)
        return budget.clamp(max=self.layout.window_size)

    def _limit_window(self, state: WindowState) -> None:
        """Each row's window cut to `_window_length`: slots past it return to MASK."""
        state.length = self._window_length(state)
        state.window = state.window.masked_fill(self.layout.slots >= state.length[:, None], self.layout.mask_id)

    def select_rows(self, index: torch.Tensor) -> None:
        for part in (self.drafts, self.schedule, *self.sources):
            if part is not None:
                part.select(index)
        if self.draft_probs is not None:
            self.draft_probs = self.draft_probs[index]

    def joined_rows(self, other: "LosslessPolicy") -> Updates:
        """`other`'s rows appended, which have had their first forward (so this batch has, too)."""
        draft_probs = self.draft_probs
        if other.draft_probs is not None:
            mine = self.draft_probs if self.draft_probs is not None else other.draft_probs[:0]
            draft_probs = torch.cat([mine, other.draft_probs])
        schedule = [] if self.schedule is None else [(self.schedule, self.schedule.joined(other.schedule))]
        sources = [update for mine, theirs in zip(self.sources, other.sources) for update in mine.joined(theirs)]
        return [
            (self.drafts, self.drafts.joined(other.drafts)), *schedule, *sources,
            (self, {"draft_probs": draft_probs, "started": True, "certain_only": False}),
        ]

    def counters(self) -> dict[str, torch.Tensor]:
        return {"drafted": self.drafts.drafted, "accepted": self.drafts.accepted, "corrected": self.drafts.corrected}
