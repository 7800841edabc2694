"""Lossless mode's check of a forward's drafts, at one fixed point of the step: after the forward, before the commit.

A check reads the forward and the plan and returns one `Verdict`: how many drafts each row checked and passed,
what it commits, the token that becomes certain, and the logits and scores the commit records. The commit
(`lossless.py`) takes the verdict whatever produced it, so a new way to verify (another acceptance rule, another
draft shape) is one new variant here. `ChainCheck` verifies the window's leading drafts, greedily or through the
call's processors and speculative sampling (`verify.py`); `TreeCheck` also tries each row's lookup branches
where the window's chain leaves them (`tree.py`). Both keep their math in those modules.
"""

from dataclasses import dataclass

import torch

from .fill import gather_columns
from .tree import Branch, verify as verify_tree
from .verify import Verifier, greedy_accept
from .window import Forward, StepPlan, WindowLayout, WindowState


@dataclass
class Verdict:
    """What one forward's check decided, per row: what the commit applies."""

    start: int
    """The slot the checked drafts start at: 0 in the first forward (no certain token yet), else 1."""
    drafts: torch.Tensor
    """The window's own drafts checked (the draft schedule weighs these)."""
    checked: torch.Tensor
    """Every draft checked: the window's and, in a tree, its branches' tokens."""
    committed: torch.Tensor
    """The slots from `start` on that go to the output (a taken branch's tokens written into them)."""
    accepted: torch.Tensor
    """How many of the window's own drafts passed: a row with fewer than it checked corrects one."""
    next_certain: torch.Tensor
    """The verified token after the committed ones: the next certain token."""
    raw: torch.Tensor | None
    scores: torch.Tensor | None
    """(rows, n + 1, vocab) the logits and processed scores at the position before each checked slot (None where
    the check needed neither: greedy, no kept scores)."""
    commit: bool
    """Whether any row may commit a draft (a forward that fed no draft commits nothing)."""
    branch_columns: torch.Tensor | None = None
    """With a tree: the fed column of each window slot's K/V after the check (`Branch.kept_columns`)."""


@dataclass
class ChainCheck:
    """The window's leading drafts, checked in order: greedy (the argmax of the raw logits) where no processor,
    sampling or penalty changes the scores, else through them (speculative sampling for sampled rows)."""

    verifier: Verifier
    layout: WindowLayout
    first_drafts: int
    """The most drafts a row holds before the first forward (in slots 0 on; 0: none)."""

    def first(self, state: WindowState, plan: StepPlan, forward: Forward) -> Verdict:
        """The first forward's check, before any certain token: the prompt's last logits decide at slot 0, each
        draft's logits at the slot after it (`plan.leading` drafts per row)."""
        size = self.first_drafts
        columns = forward.physical[:, :size].clamp(0, forward.fed - 1)
        raw = torch.cat([forward.prompt_logits[:, None], gather_columns(forward.logits, columns)], 1)
        drafts = plan.leading
        accepted, next_certain, scores = self.verifier.prefill(state, raw, state.window[:, :size], drafts)
        return Verdict(0, drafts, drafts, accepted, accepted, next_certain, raw, scores, commit=size > 0)

    def after(
        self, state: WindowState, plan: StepPlan, forward: Forward, draft_probs: torch.Tensor | None
    ) -> Verdict:
        """A later forward's check: the logits at the certain token and at each leading draft (`draft_probs`: the
        distributions sampled drafts were drawn from, (rows, window_size, vocab))."""
        window_size, logits, fed, verifier = self.layout.window_size, forward.logits, forward.fed, self.verifier
        ar_columns = forward.physical[:, :window_size].clamp(max=fed - 1)  # the certain token's and each draft's
        raw = scores = gather_columns(logits, ar_columns) if verifier.needs_scores or state.scores.kinds else None
        chosen = None if verifier.needs_scores else logits.argmax(-1).gather(1, ar_columns)
        draft_probs = None if draft_probs is None else draft_probs[:, 1:window_size]
        if verifier.needs_scores:
            scores = verifier.scores(state, raw, plan.leading)
        return self._passed(state, plan, forward, raw, scores, chosen, draft_probs)

    def next_certain(self, state: WindowState, forward: Forward, one: torch.Tensor) -> torch.Tensor:
        """After a forward of the certain tokens alone (`one` position per row): the token chosen after each."""
        if not self.verifier.needs_scores:
            return forward.logits[:, 0].argmax(-1)
        scores = self.verifier.scores(state, forward.logits[:, :1], one)
        return self.verifier.next_tokens(scores, state)[:, 0]

    def _passed(
        self, state: WindowState, plan: StepPlan, forward: Forward, raw: torch.Tensor | None,
        scores: torch.Tensor | None, chosen: torch.Tensor | None, draft_probs: torch.Tensor | None,
    ) -> Verdict:
        """The verdict on the window's chain: `scores` where the check needs them, else the raw argmax `chosen`."""
        drafts, draft_tokens = plan.leading - 1, state.window[:, 1 : self.layout.window_size]
        if self.verifier.needs_scores:
            accepted, next_certain = self.verifier.verify(scores, draft_tokens, drafts, draft_probs, state)
        else:
            in_draft = self.layout.slots[:, : self.layout.window_size - 1] < drafts[:, None]
            accepted, next_certain = greedy_accept(chosen, draft_tokens, in_draft)
        return Verdict(1, drafts, drafts, accepted, accepted, next_certain, raw, scores, commit=forward.fed > 1)


@dataclass
class TreeCheck(ChainCheck):
    """The window's chain, and where it leaves a row's lookup branches, those too (`tree.verify`); a forward
    that fed no branch column is checked as a chain."""

    branch: Branch
    """The branches the last plan handed the forward (the lookup source's, kept current in place)."""

    def _passed(
        self, state: WindowState, plan: StepPlan, forward: Forward, raw: torch.Tensor | None,
        scores: torch.Tensor | None, chosen: torch.Tensor | None, draft_probs: torch.Tensor | None,
    ) -> Verdict:
        if forward.branch_logits is None:
            return super()._passed(state, plan, forward, raw, scores, chosen, draft_probs)
        drafts, draft_tokens = plan.leading - 1, state.window[:, 1 : self.layout.window_size]
        accepted, _, committed, next_certain, columns = verify_tree(
            self.verifier, state, scores, chosen, draft_tokens, drafts, draft_probs, self.branch,
            forward.branch_logits, self.layout.window_size,
        )
        checked = drafts + plan.branch_count.sum(1)
        return Verdict(1, drafts, checked, committed, accepted, next_certain, raw, scores, True, columns)
