"""Lossless mode's adaptive draft schedule (`wedlm_draft_schedule="adaptive"`): how many drafts each row checks.

A window of `draft_limit + 2` slots checks `draft_limit` drafts (the certain token, the drafts, and one mask whose
prediction duplicates the certain token's AR prediction); `draft_limit` 0 is one-token AR, a forward of one column
as in greedy decoding. The limit follows acceptance, as transformers' assisted generation adapts its draft length:
after a rejection before half the limit, twice as many as were accepted (none: zero drafts; a later rejection keeps
it); after a forward that accepts every draft, double plus one, up to the most (`window_size - 2`). (Cut to the
accepted count alone, a row whose drafts pass in runs of varying length spent forwards growing back: `smollm2-wedlm`
made 8.13 tokens per forward on `wedlm-hf bench`'s counting prompts, 8.68 with the doubled cut; at 64 new tokens
6.92 and 7.11. The embedded checkpoint's counting is unchanged: its drafts rarely fail before half the limit.)

Where drafts fail, lossless mode costs what AR costs plus its tries: a row at zero drafts tries one draft again
(two wider forwards: one to draft, one to verify) after `probe_wait` AR tokens, a wait that doubles from
`FIRST_AR_RUN` to `LONGEST_AR_RUN` while tries fail and resets when one passes, and only while its tries' cost
(`TRY_COST` AR forwards each, declared per device) stays within `LOSS_BOUND` of its AR decoding plus the forwards its
accepted drafts saved: a bounded loss where drafts never pass, tries as often as the waits allow where they pay.
Where the row starts is what is known before any verification: a model not trained for WeDLM
(`support.is_wedlm_trained`) at zero drafts, a trained one at the most, cut after its first forward to the leading
drafts predicted with confidence (`CONFIDENT_ENTROPY`, or the call's entropy threshold).
"""

import math
from dataclasses import dataclass

import torch

from .window import PerRow

FIRST_AR_RUN = 4
LONGEST_AR_RUN = 64
"""The fewest and the most AR tokens a row decodes before it tries one draft again."""
LOSS_BOUND = 0.01
"""Where drafts never pass, a row's tries cost at most this share of its AR decoding (in forwards)."""
TRY_COST = {"cpu": 2.0}
"""What a failed try costs, in AR forwards, per device type: its two forwards of three columns against two of one.
On a CPU a forward of a few columns costs far more than one of a single column (matrix-matrix products against
matrix-vector ones): about 1 for the embedded checkpoint and 2 for SmolLM2-135M (0.8-1.25 and 1.9-2.25 across runs
on a 2-vCPU AMD EPYC, `scripts/step_cost.py --never-slower --smollm2`, 2026-12-05); about the larger is declared.
Elsewhere (`ACCELERATOR_TRY_COST`) a forward of a few columns costs about what one of a single column does."""
ACCELERATOR_TRY_COST = 0.1
"""A try's cost on a GPU or other accelerator, declared, not measured: about the wider window's extra step work."""
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
    tokens_per_try: int
    """The AR tokens whose `LOSS_BOUND` pays for one try on the rows' device (`TRY_COST`)."""

    @classmethod
    def starting(cls, generated: torch.Tensor, window_size: int, trained: bool) -> "DraftSchedule":
        most = max(window_size - 2, 0)
        schedule = cls(
            draft_limit=torch.full_like(generated, most if trained else 0),
            probe_wait=torch.full_like(generated, FIRST_AR_RUN), try_at=generated + FIRST_AR_RUN,
            probes=torch.zeros_like(generated), most=most,
            tokens_per_try=round(TRY_COST.get(generated.device.type, ACCELERATOR_TRY_COST) / LOSS_BOUND),
        )
        schedule.try_at = torch.maximum(schedule.try_at, schedule.rationed(torch.zeros_like(generated)))
        return schedule

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
        limit = torch.where(corrected & (2 * accepted < self.draft_limit), 2 * accepted, limit)
        longer_wait = torch.where(corrected, (2 * self.probe_wait).clamp(max=LONGEST_AR_RUN), self.probe_wait)
        self.probe_wait = longer_wait.masked_fill(accepted > 0, FIRST_AR_RUN)
        try_at = torch.maximum(generated + self.probe_wait, self.rationed(accepted_so_far))
        self.try_at = torch.where((limit == 0) & (self.draft_limit > 0), try_at, self.try_at)  # rows turning AR
        self.probe(limit, generated)

    def rationed(self, accepted_so_far: torch.Tensor) -> torch.Tensor:
        """The generated count from which the ration allows a row its next try: its tries, that one included, cost
        at most `LOSS_BOUND` of its AR forwards plus the `accepted_so_far` drafts (a forward saved each)."""
        return (self.probes + 1) * self.tokens_per_try - round(1 / LOSS_BOUND) * accepted_so_far

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
