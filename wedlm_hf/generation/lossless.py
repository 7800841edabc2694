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
"""

import torch

from .draft_schedule import DraftSchedule
from .draft_state import DraftState, MaskTokenPredicted
from .fill import SlotFiller, gather_columns
from .record import OutputRecord
from .lookup import PromptLookup
from .tree import Branch, plan_fields, verify as verify_tree
from .verify import Verifier, greedy_accept
from .window import Forward, Kept, StepPlan, Updates, WindowLayout, WindowState, leading_filled, shift

class LosslessPolicy:
    """AR decoding by verification. Per row, `draft_limit` bounds the drafts a forward checks: a window of
    `draft_limit + 2` slots, as `wedlm_draft_schedule="adaptive"` sets it (`draft_schedule.py`); `"full"` drafts
    every slot of a `window_size` window, always. With prompt lookup (`lookup.py`), a row whose slot after the
    certain token holds no mask prediction takes the context's continuation there, whatever its `draft_limit`:
    such a draft costs no forward of its own; before the first forward, every row with a match takes it in slots 0
    on (the prefill verifies them). With `tree`, every later step verifies each row's lookup drafts beside its
    window's (`tree.py`).
    """

    counter_names = ("drafted", "accepted", "corrected")

    def __init__(
        self, layout: WindowLayout, record: OutputRecord, filler: SlotFiller, state: WindowState, adaptive: bool,
        verifier: Verifier, lookup: PromptLookup | None = None, trained: bool = True, tree: bool = False,
    ):
        self.layout, self.record, self.filler, self.adaptive = layout, record, filler, adaptive
        self.verifier, self.lookup, self.trained, length = verifier, lookup, trained, state.length
        self.drafts = DraftState(
            drafted=torch.zeros_like(length), accepted=torch.zeros_like(length), corrected=torch.zeros_like(length),
            mask_predicted=torch.zeros_like(state.done), from_lookup=torch.zeros_like(state.done),
            lookup_ok=torch.ones_like(state.done),
        )
        self.branch = Branch.empty(length, lookup.matches, lookup.slots(layout)) if tree and lookup else None
        """With trees: each row's lookup branches (`PromptLookup.matches` of them), verified beside its window."""
        self.schedule = DraftSchedule.starting(state.generated, trained, filler.settings, record.sampling)
        """The adaptive schedule's row state (with `"full"`, only its `most` is read)."""
        self.draft_probs: torch.Tensor | None = None
        """Sampling: (rows, window_size, vocab) the distribution q each draft was drawn from (drafts live in the
        first `window_size` slots), allocated at the first forward."""
        self.started = False
        """Whether the first forward ran: it has no certain token yet, only the prompt's AR prediction."""
        self.certain_only = False
        """Whether every window is its certain token then masks (as an AR-only forward leaves it without lookup)."""
        self._limit_window(state)

    def plan(self, state: WindowState) -> StepPlan:
        if not self.started:  # prompt lookup drafts from the prompt (slots 0 on), checked by the first forward too
            if self.lookup is not None:
                rows = ~state.done
                self.drafts.from_lookup = self.lookup.draft(self.record, state, self.layout, rows, None, prefill=True)
            filled, leading = leading_filled(state, self.layout)
            length = torch.minimum(state.length + leading, state.max_new_tokens - state.generated)
            return StepPlan(length, state.generated, filled, leading, all_columns=self.lookup is not None,
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
        """Verify, commit and draft from this forward; returns the K/V per row the cache keeps."""
        if not self.started:
            return self._first_update(state, plan, forward)
        if forward.fed == 1 and not state.scores.kinds and forward.branch_logits is None:
            return self._ar_only_update(state, plan, forward)
        self.certain_only = False
        window_size, drafts, logits, fed = self.layout.window_size, plan.leading - 1, forward.logits, forward.fed
        slots, verifier = self.layout.slots, self.verifier
        ar_columns = forward.physical[:, :window_size].clamp(max=fed - 1)  # the certain token's and each draft's
        draft_tokens = state.window[:, 1:window_size]
        raw = scores = gather_columns(logits, ar_columns) if verifier.needs_scores or state.scores.kinds else None
        chosen = None if verifier.needs_scores else logits.argmax(-1).gather(1, ar_columns)
        draft_probs = None if self.draft_probs is None else self.draft_probs[:, 1:window_size]
        if verifier.needs_scores:
            scores = verifier.scores(state, raw, plan.leading)
        took = branch_columns = None
        if forward.branch_logits is not None:  # a tree: the window's drafts, or the branch from where it leaves them
            accepted, took, committed, next_certain, branch_columns = verify_tree(
                verifier, state, scores, chosen, draft_tokens, drafts, draft_probs, self.branch, forward.branch_logits,
                window_size,
            )
        elif verifier.needs_scores:
            accepted, next_certain = verifier.verify(scores, draft_tokens, drafts, draft_probs, state)
        else:
            accepted, next_certain = greedy_accept(chosen, draft_tokens, slots[:, : window_size - 1] < drafts[:, None])
        committed = accepted if took is None else committed
        # 3. commit the accepted drafts (their K/V are this forward's), then the verified token becomes certain (an
        #    AR-only forward, one column per row, verified no drafts: nothing to commit)
        checked, commit = drafts if took is None else drafts + plan.branch_count.sum(1), fed > 1 or took is not None
        slot_physical, corrected = self._commit_verified(
            state, plan, forward, 1, checked, committed, accepted, next_certain, raw, scores, commit
        )
        # 4. new drafts from this forward's mask predictions; after a correction every one of them saw the rejected
        #    draft (and a rejected slot's logits predict the slot after it), so those rows draft in the next forward;
        #    only mask slots fill, and their logits are the last `mask_columns` (none in an AR-only forward)
        masks = forward.mask_columns
        if masks:
            fillable = self._fillable(state) & ~corrected[:, None]
            self.filler.fill(state, logits[:, fed - masks :], slot_physical - (fed - masks), fillable, self.draft_probs)
        if self.adaptive and fed == 1:  # no window checked a draft (a tree's were its branches'): the tries alone
            self.schedule.probe(self.schedule.draft_limit, state.generated)
        elif self.adaptive:  # with prompt lookup, the limit follows the mask predictions' drafts only
            mask_drafted = ~self.drafts.from_lookup if self.lookup is not None else torch.ones_like(corrected)
            checked = (drafts * mask_drafted, accepted * mask_drafted, corrected & mask_drafted)
            self.schedule.adapt(*checked, state.generated, self.drafts.accepted)
        self._limit_window(state)
        self._draft_from_context(state)
        return Kept(1 + committed, branch_columns)

    def _first_update(self, state: WindowState, plan: StepPlan, forward: Forward) -> Kept:
        """`update` after the first forward, which has no certain token yet: the prompt's AR prediction decides, at
        the prompt lookup drafts of slots 0 on (`plan.leading` per row) first; the accepted ones are committed (their
        K/V kept), the token after them becomes certain, and the mask predictions fill the slots after it unless a
        draft failed (they saw it). Rows with no drafts commit nothing here: slot 0 gets the prompt's prediction."""
        self.started, layout, logits = True, self.layout, forward.logits
        if self.verifier.do_sample:
            shape = (state.window.shape[0], layout.window_size, logits.shape[-1])
            self.draft_probs = torch.zeros(shape, device=logits.device)
        size = 0 if self.lookup is None else self.lookup.slots(layout)
        columns = forward.physical[:, :size].clamp(0, forward.fed - 1)
        raw = torch.cat([forward.prompt_logits[:, None], gather_columns(logits, columns)], 1)
        drafts = plan.leading
        accepted, next_certain, scores = self.verifier.prefill(state, raw, state.window[:, :size], drafts)
        slot_physical, corrected = self._commit_verified(
            state, plan, forward, 0, drafts, accepted, accepted, next_certain, raw, scores, commit=size > 0
        )
        fillable = self._fillable(state) & ~corrected[:, None]
        entropy = self.filler.fill(state, logits, slot_physical, fillable, self.draft_probs, with_entropy=self.adaptive)
        greedy = self.verifier.greedy_rows(state)  # (sampled drafts pass by p/q: no cut for those)
        if self.adaptive and self.trained and greedy is not None and entropy is not None:
            self.schedule.first_window(entropy[:, 1:], self.filler.settings.entropy_threshold, greedy & ~corrected)
        self._limit_window(state)
        self._draft_from_context(state)
        return Kept(accepted)

    def _commit_verified(
        self, state: WindowState, plan: StepPlan, forward: Forward, start: int, checked: torch.Tensor,
        committed: torch.Tensor, accepted: torch.Tensor, next_certain: torch.Tensor, raw: torch.Tensor | None,
        scores: torch.Tensor | None, commit: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """After verifying `checked` drafts per row: the `committed` slots from `start` on (`accepted` of them the
        window's own) go to the output (if `commit`), each with the logits and scores (`raw`, `scores`: (rows,
        n + 1, vocab), from the position before slot `start`) of the position before it; the window moves past
        them, a row that rejected a draft returns its drafts to MASK, and `next_certain` becomes the certain token.
        Returns each slot's fed column after the move, and which rows rejected a draft (a row whose branch extends
        all its drafts keeps the predictions past it)."""
        counts, corrected = self.drafts, accepted < plan.leading - start  # (the drafts from slot `start` on)
        counts.drafted, counts.accepted = counts.drafted + checked, counts.accepted + committed
        counts.corrected = counts.corrected + corrected
        if self.lookup is not None and self.branch is None:  # (read only where lookup drafts the window's chain)
            counts.lookup_ok = ~counts.from_lookup | (accepted > 0)
        if state.scores.kinds:
            width = raw.shape[1] - 1
            state.scores.place(slice(start, start + width), raw[:, :width], scores[:, :width])
        if commit:
            state.done |= self.record.commit(state, committed, start=start)
        certain = [None if values is None else gather_columns(values, accepted[:, None]) for values in (raw, scores)]
        slot_physical = shift(state, self.layout, start + committed, plan.length, forward.physical)
        if self.draft_probs is not None:  # (a slot coming from past the window is a mask: its q is never read)
            source = (self.layout.slots[:, : self.draft_probs.shape[1]] + (start + committed)[:, None])
            source = source.clamp(max=self.draft_probs.shape[1] - 1)[..., None].expand_as(self.draft_probs)
            self.draft_probs = self.draft_probs.gather(1, source)
        state.window = state.window.masked_fill(corrected[:, None] & (self.layout.slots >= 1), self.layout.mask_id)
        self._place_certain(state, next_certain, *certain)
        return slot_physical, corrected

    def _ar_only_update(self, state: WindowState, plan: StepPlan, forward: Forward) -> Kept:
        """`update` after a forward of one column per row (every window is the certain token alone): its chosen
        token is the next certain token, written over slot 0 (the slots after it hold masks, whose draft
        distributions are never read); nothing to verify, count, fill or shift. The general path's result in far
        fewer ops: most lossless forwards are of this kind where drafts fail."""
        one = self.layout.slot_zero_only(plan.length.shape[0])[1]
        if self.verifier.needs_scores:
            scores = self.verifier.scores(state, forward.logits[:, :1], one)
            next_certain = self.verifier.next_tokens(scores, state)[:, 0]
        else:
            next_certain = forward.logits[:, 0].argmax(-1)
        self._place_certain(state, next_certain, None, None)
        if self.adaptive:
            self.schedule.probe(self.schedule.draft_limit, state.generated)
        state.length = self._window_length(state)  # at least 1: a row with no budget left ended at the commit
        self.certain_only = self.lookup is None  # (prompt lookup may draft after the certain token now)
        self._draft_from_context(state)
        return Kept(one)

    def _draft_from_context(self, state: WindowState) -> None:
        """Prompt lookup drafts the slots after the certain token in rows whose mask predictions drafted nothing
        there and whose mask drafts are off: adaptive, rows at zero drafts (a row whose limit was only cut keeps its
        mask drafts: on the embedded checkpoint's counting prompts lookup there cost 10.0 -> 7.2 tokens per
        forward); `"full"`, unless the row's last lookup drafts all failed (the sources then take turns): a failed
        lookup draft costs a row whose mask drafts pass the forward predicting its next ones. With trees, every
        row's lookup drafts become its branch instead (not under penalties, whose scores a branch would need along
        its own prefix): a failed branch costs its columns, not the window's predictions."""
        if self.lookup is None:
            return
        rows = self.drafts
        if self.branch is not None:
            rows.from_lookup = torch.zeros_like(rows.from_lookup)  # (the window's drafts are the mask slots' now)
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
            return
        eligible = state.window[:, 1] == self.layout.mask_id
        eligible &= self.schedule.draft_limit == 0 if self.adaptive else rows.lookup_ok
        rows.from_lookup = self.lookup.draft(self.record, state, self.layout, eligible, self.draft_probs)

    def _fillable(self, state: WindowState) -> torch.Tensor:
        window_size = self.layout.window_size
        return (state.window[:, :window_size] == self.layout.mask_id) & (self.layout.slots[:, :window_size] >= 1)

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
        if self.adaptive:
            return self.schedule.window_length(budget, self.layout.window_size)
        return budget.clamp(max=self.layout.window_size)

    def _limit_window(self, state: WindowState) -> None:
        """Each row's window cut to `_window_length`: slots past it return to MASK."""
        state.length = self._window_length(state)
        state.window = state.window.masked_fill(self.layout.slots >= state.length[:, None], self.layout.mask_id)

    def select_rows(self, index: torch.Tensor) -> None:
        self.drafts.select(index)
        self.schedule.select(index)
        if self.branch is not None:
            self.branch.select(index)
        if self.draft_probs is not None:
            self.draft_probs = self.draft_probs[index]

    def joined_rows(self, other: "LosslessPolicy") -> Updates:
        """`other`'s rows appended, which have had their first forward (so this batch has, too)."""
        draft_probs = self.draft_probs
        if other.draft_probs is not None:
            mine = self.draft_probs if self.draft_probs is not None else other.draft_probs[:0]
            draft_probs = torch.cat([mine, other.draft_probs])
        branch = [] if self.branch is None else [(self.branch, self.branch.joined(other.branch))]
        return [
            (self.drafts, self.drafts.joined(other.drafts)), (self.schedule, self.schedule.joined(other.schedule)),
            *branch, (self, {"draft_probs": draft_probs, "started": True, "certain_only": False}),
        ]

    def counters(self) -> dict[str, torch.Tensor]:
        return {"drafted": self.drafts.drafted, "accepted": self.drafts.accepted, "corrected": self.drafts.corrected}
