"""Lossless mode's adaptive draft schedule (`wedlm_draft_schedule="adaptive"`): how many drafts each row checks.

A window of `draft_limit + 2` slots checks `draft_limit` drafts (the certain token, the drafts, and one mask whose
prediction duplicates the certain token's AR prediction); `draft_limit` 0 is one-token AR, a forward of one column
as in greedy decoding. The limit follows acceptance, as transformers' assisted generation adapts its draft length:
after a rejection before half the limit, as many as were accepted (a later rejection keeps it); after a forward
that accepts every draft, double plus one, up to the most (`window_size - 2`).

Where drafts fail, lossless mode costs what AR costs plus its tries: a row at zero drafts tries one draft again
(two wider forwards: one to draft, one to verify) after `probe_wait` AR tokens, a wait that doubles from
`FIRST_AR_RUN` to `LONGEST_AR_RUN` while tries fail and resets when one passes, and never while its tries exceed
`TOKENS_PER_PROBE`'s ration. Where the row starts is what is known before any verification: a model not trained
for WeDLM (`support.is_wedlm_trained`) starts at zero drafts and tries first after `TOKENS_PER_PROBE` tokens (a
failed try costs SmolLM2-135M about 1.5 forwards, 2% of a 64-token decode), a trained one at the most, cut after
its first forward to the leading drafts predicted with confidence (`CONFIDENT_ENTROPY`, or the call's entropy
threshold).
"""

import math
from dataclasses import dataclass

import torch

from .window import PerRow

FIRST_AR_RUN = 4
LONGEST_AR_RUN = 64
"""The fewest and the most AR tokens a row decodes before it tries one draft again."""
TOKENS_PER_PROBE = 64
"""A row tries a draft again only while its earlier tries number at most one per this many tokens it generated
plus one per draft it had accepted. A try costs about one AR forward on a CPU (its two wider forwards: 1.5 on
SmolLM2-135M, 0.6 on the embedded checkpoint; far less on a GPU) and an accepted draft saves one, so where drafts
never pass the tries cost at most ~2% of AR decoding (`scripts/step_cost.py` measures it)."""
CONFIDENT_ENTROPY = 1.0
"""Entropy (nats) below which a first-window mask prediction counts as a draft worth checking: on the embedded
checkpoint, counting predicts its drafts below 0.5 and held-out code above 1.5, where the first full window's
check (31 columns) cost 2% of a 64-token decode and found almost nothing."""


@dataclass
class DraftSchedule(PerRow):
    """Per running row: the drafts the next forward checks, and the tries of a row at zero drafts."""

    draft_limit: torch.Tensor
    probe_wait: torch.Tensor
    """How many AR tokens a row at zero drafts decodes before its next try."""
    try_at: torch.Tensor
    """The generated count at which a row at zero drafts tries next (set as it turns AR)."""
    probes: torch.Tensor
    """Tries so far."""
    most: int
    """The most drafts a forward checks (`window_size - 2`)."""
    first_try: int
    """Tokens before the ration allows a first try: 0, or `TOKENS_PER_PROBE` for a model not trained for WeDLM."""

    @classmethod
    def starting(cls, generated: torch.Tensor, window_size: int, trained: bool) -> "DraftSchedule":
        most, first_try = max(window_size - 2, 0), 0 if trained else TOKENS_PER_PROBE
        return cls(
            draft_limit=torch.full_like(generated, most if trained else 0),
            probe_wait=torch.full_like(generated, FIRST_AR_RUN), try_at=generated + max(FIRST_AR_RUN, first_try),
            probes=torch.zeros_like(generated), most=most, first_try=first_try,
        )

    def first_window(self, entropy: torch.Tensor, threshold: float | None, rows: torch.Tensor) -> None:
        """After the first forward: rows `rows` (a bool per row) check only the leading drafts whose predictions'
        `entropy` (rows, slots 1 on) is below the call's finite `wedlm_entropy_threshold`, else below
        `CONFIDENT_ENTROPY`."""
        bound = threshold if threshold is not None and math.isfinite(threshold) else CONFIDENT_ENTROPY
        confident = (entropy[:, : self.most] < bound).int().cumprod(1).sum(1)
        self.draft_limit = torch.where(rows, torch.minimum(self.draft_limit, confident), self.draft_limit)

    def adapt(
        self, drafts: torch.Tensor, accepted: torch.Tensor, corrected: torch.Tensor, generated: torch.Tensor,
        accepted_so_far: torch.Tensor,
    ) -> None:
        """The limit after a forward that checked `drafts` and accepted `accepted` of them per row."""
        all_accepted = (drafts > 0) & ~corrected
        limit = torch.where(all_accepted, (2 * self.draft_limit + 1).clamp(max=self.most), self.draft_limit)
        limit = torch.where(corrected & (2 * accepted < self.draft_limit), accepted, limit)
        longer_wait = torch.where(corrected, (2 * self.probe_wait).clamp(max=LONGEST_AR_RUN), self.probe_wait)
        self.probe_wait = longer_wait.masked_fill(accepted > 0, FIRST_AR_RUN)
        rationed = self.first_try + TOKENS_PER_PROBE * (self.probes - accepted_so_far)
        try_at = torch.maximum(generated + self.probe_wait, rationed)
        self.try_at = torch.where((limit == 0) & (self.draft_limit > 0), try_at, self.try_at)  # rows turning AR
        self.probe(limit, generated)

    def probe(self, limit: torch.Tensor, generated: torch.Tensor) -> None:
        """Set the limit to `limit`, except that a row at zero drafts that has generated `try_at` tokens tries
        one draft."""
        probe = (limit == 0) & (generated >= self.try_at)
        self.probes = self.probes + probe
        self.draft_limit = limit.masked_fill(probe, min(1, self.most))

    def window_length(self, budget: torch.Tensor, window_size: int) -> torch.Tensor:
        """Window per row: `draft_limit + 2` slots (1 at zero drafts), at most `window_size`, within `budget`."""
        limit = self.draft_limit
        return torch.minimum((limit + 2).masked_fill(limit == 0, 1).clamp(max=window_size), budget)
