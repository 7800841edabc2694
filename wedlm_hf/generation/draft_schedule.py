"""Lossless mode's adaptive draft schedule (`wedlm_draft_schedule="adaptive"`): how many drafts the batch checks.

A window of `d + 2` slots checks d drafts: the certain token, the drafts, one mask whose prediction duplicates the
certain token's AR prediction, and d more mask slots appended, whose predictions are the next forward's drafts, so a
row checking d drafts feeds 2d + 2 columns (d = 0: the certain token alone, one column, as greedy decoding feeds).
A batched forward pads every row to the widest, so the width is the batch's: the forward costs B rows times its
columns whatever each row needs, priced by the cost model (`forward_cost.py`) at the batch's size.

Each verifying forward, each row's recent acceptance gives it a pass rate p (drafts passed over drafts passed and
rejections, each forward's counts weighed by `MEMORY` per forward since): a draft at depth j is expected to pass
with p^j, so d drafts add p + ... + p^d tokens to the one every forward commits. The batch checks the d that gives
the most expected tokens per unit of time, every row alike (a row's columns are paid anyway); where nothing pays, d
is 0 and the batch runs greedy steps. So on a CPU a row whose drafts pass half the time checks three at batch 1,
rows passing 19 times in 20 check 7 at batch 8, and at batch 16 or 32 none: 2d + 2 columns for that many rows
cost more there than any acceptance returns. Output is the model's own AR decoding whatever the width (lossless.py).

A row that samples with draws of its own (a continuous-batching request's seed) draws along its drafts, so its
tokens depend on its width: such a row checks the width that pays for it alone, whatever runs beside it.

A row at zero drafts learns nothing of its drafts, so it tries one draft again now and then: one forward of three
columns feeds the mask slots whose prediction is the draft, the next (four columns) verifies it. Tries wait
`FIRST_AR_RUN` AR tokens, doubling up to `LONGEST_AR_RUN` while they fail and back when one passes, and are rationed
by what they cost at the batch's size: a row's tries, its first included, cost at most `TRY_ALLOWANCE` AR forwards
plus `LOSS_BOUND` of its AR decoding plus the forwards its accepted drafts saved. (At batch 1 on a CPU the declared
model prices a try at about 0.7 AR forwards, so the waits decide: an answer whose drafts start to pass after its
first few tokens is found within a few more; at batch 8 about 1.6, and the ration spaces the tries out. Where a
profile measured a wider forward's premium, as SmolLM2-135M's 2.7 AR forwards per try on a 2-vCPU AMD EPYC, the
first try waits until the row's AR decoding pays for it, so a short answer tries none.) One row's try widens the
forward for all, so every row at zero drafts tries with it (but one with draws of its own); at a batch size where no
width pays even if every draft passed, no row tries.

Where the row starts is what is known before any verification: a model not trained for WeDLM
(`support.is_wedlm_trained`) at zero drafts, a trained one at the width that pays where every draft passes (its
first window, fed with the prompt), after its first forward counting the leading drafts predicted with confidence
(`CONFIDENT_ENTROPY`, or the call's entropy threshold) as passed, and the first unconfident one as rejected.
"""

import math
from dataclasses import dataclass, field

import torch

from .forward_cost import ForwardCost
from .sampling import RowSampling
from .settings import WeDLMSettings
from .window import PerRow

FIRST_AR_RUN = 4
LONGEST_AR_RUN = 64
"""The fewest and the most AR tokens a row decodes before it tries one draft again."""
LOSS_BOUND = 0.02
TRY_ALLOWANCE = 2.0
"""Where drafts never pass, a row's tries cost at most `TRY_ALLOWANCE` AR forwards plus `LOSS_BOUND` of its AR
decoding (by the cost model's price of a try)."""
MEMORY = 0.3
"""The weight of a row's draft counts per verifying forward since: its pass rate follows its last few forwards."""
CONFIDENT_ENTROPY = 1.0
"""Entropy (nats) below which a first-window mask prediction counts as a draft worth checking: on the embedded
checkpoint, counting predicts its drafts below 0.5 and held-out code above 1.5, where the first full window's
check (31 columns) cost 2% of a 64-token decode and found almost nothing."""


def columns(drafts: int) -> int:
    """The columns a row checking `drafts` drafts feeds (see the module docstring)."""
    return 2 * drafts + 2 if drafts else 1


@dataclass(frozen=True)
class BatchPrices:
    """What the cost model says of one batch size, computed once per size on the host."""

    times: torch.Tensor
    """(most + 1) the time of a step checking 0, 1, ... `most` drafts per row."""
    tokens_per_try: float
    """The AR tokens whose `LOSS_BOUND` pays for one try: its forwards of three and four columns against two of
    one."""
    tries_pay: bool
    """Whether some width would pay if every draft passed (else no row tries)."""

    @classmethod
    def of(cls, cost: ForwardCost, rows: int, most: int, device: torch.device) -> "BatchPrices":
        times = [cost.step(rows * columns(drafts), drafts > 0) for drafts in range(most + 1)]
        ar = times[0]
        extra = cost.step(rows * 3, True) + cost.step(rows * 4, True) - 2 * ar
        pays = any((1 + drafts) / times[drafts] > 1 / ar for drafts in range(1, most + 1))
        return cls(torch.tensor(times, device=device), extra / ar / LOSS_BOUND, pays)


@dataclass
class DraftSchedule(PerRow):
    """Per running row: the drafts the next forward checks, the row's recent draft counts, and its tries."""

    draft_limit: torch.Tensor
    passed: torch.Tensor
    failed: torch.Tensor
    """(float) Drafts passed and forwards that rejected one, weighed by `MEMORY` per verifying forward since."""
    probe_wait: torch.Tensor
    """How many AR tokens a row at zero drafts decodes before its next try."""
    try_at: torch.Tensor
    """The generated count at which a row at zero drafts tries next (set as it turns AR)."""
    probes: torch.Tensor
    """Tries so far."""
    own: torch.Tensor
    """Rows whose width is their own, priced as if alone: their draws follow their drafts."""
    most: int
    """The most drafts a forward checks (`window_size - 2`)."""
    cost: ForwardCost
    keyed: bool
    """Whether any row may be `own` (rows sample with draws of their own)."""
    beside: int = 0
    """Rows already decoding that these join after their first forward (continuous batching): their first widths
    are priced at the joined batch's size, where their second forward runs, not at their admission group's."""
    priced: dict[int, BatchPrices] = field(default_factory=dict, repr=False)
    """`BatchPrices` per batch size met so far."""
    widths_of: tuple[torch.Tensor, int, torch.Tensor] | None = field(default=None, repr=False)
    """The last `draft_limit` and window size `window_length` read, with their windows: AR steps keep the limit."""

    @classmethod
    def starting(
        cls, generated: torch.Tensor, trained: bool, settings: WeDLMSettings, sampling: RowSampling | None = None,
        beside: int = 0,
    ) -> "DraftSchedule":
        """Rows before their first forward (`sampling`: their record's), priced by the cost model of their device
        and the call's `wedlm_forward_scale` as `beside` more rows; the rows that sample with draws of their own
        are `own`."""
        most = max(settings.window_size - 2, 0)
        cost = settings.cost(generated.device.type)
        own = sampling.sample.clone() if sampling is not None and sampling.of_requests else None
        schedule = cls(
            draft_limit=torch.zeros_like(generated),
            passed=torch.full_like(generated, float(trained), dtype=torch.float),
            failed=torch.full_like(generated, float(not trained), dtype=torch.float),
            probe_wait=torch.full_like(generated, FIRST_AR_RUN), try_at=generated + FIRST_AR_RUN,
            probes=torch.zeros_like(generated),
            own=torch.zeros_like(generated, dtype=torch.bool) if own is None else own,
            most=most, cost=cost, keyed=own is not None, beside=beside,
        )
        schedule.draft_limit = schedule.widths()  # (drafts that would all pass: the first window's width)
        schedule.try_at = torch.maximum(schedule.try_at, schedule.rationed(torch.zeros_like(generated)))
        return schedule

    def joined(self, other: "DraftSchedule") -> dict:
        return {**super().joined(other), "keyed": self.keyed or other.keyed, "beside": 0}

    def first_window(self, entropy: torch.Tensor, threshold: float | None, rows: torch.Tensor) -> None:
        """After the first forward: rows `rows` (a bool per row) count the leading drafts whose predictions'
        `entropy` (rows, slots 1 on) is below the call's finite `wedlm_entropy_threshold`, else below
        `CONFIDENT_ENTROPY`, as passed, and the next as rejected; the batch's width follows."""
        bound = threshold if threshold is not None and math.isfinite(threshold) else CONFIDENT_ENTROPY
        confident = torch.minimum((entropy[:, : self.most] < bound).int().cumprod(1).sum(1), self.draft_limit)
        self.passed = torch.where(rows, confident.float(), self.passed)
        self.failed = torch.where(rows, (confident < self.most).float(), self.failed)
        self.draft_limit = self.widths()

    def adapt(
        self, drafts: torch.Tensor, accepted: torch.Tensor, corrected: torch.Tensor, generated: torch.Tensor,
        accepted_so_far: torch.Tensor,
    ) -> None:
        """The width after a forward that checked `drafts` and accepted `accepted` of them per row; a row given
        drafts to check that had none yet (a try's first forward, a row after a rejection) keeps its width."""
        checked = drafts > 0
        self.passed = torch.where(checked, MEMORY * self.passed + accepted, self.passed)
        self.failed = torch.where(checked, MEMORY * self.failed + corrected, self.failed)
        waiting = ~checked & ~corrected & (self.draft_limit > 0)
        width = self.widths()
        limit = torch.where(waiting, torch.maximum(self.draft_limit, width), width)
        longer_wait = torch.where(corrected, (2 * self.probe_wait).clamp(max=LONGEST_AR_RUN), self.probe_wait)
        self.probe_wait = longer_wait.masked_fill(accepted > 0, FIRST_AR_RUN)
        try_at = torch.maximum(generated + self.probe_wait, self.rationed(accepted_so_far))
        self.try_at = torch.where((limit == 0) & (self.draft_limit > 0), try_at, self.try_at)  # rows turning AR
        self.probe(limit, generated)

    def widths(self) -> torch.Tensor:
        """(rows) The drafts each row checks next: the number that gives the batch the most expected tokens per
        unit of time, or for an `own` row, the row alone."""
        rows = self.passed.shape[0] + self.beside
        rate = self.passed / (self.passed + self.failed).clamp(min=1e-6)
        depths = torch.arange(1, self.most + 1, device=rate.device)
        expected = rate[:, None].pow(depths).cumsum(1)  # each row's accepted drafts at each width from 1
        tokens = torch.cat([torch.ones_like(rate)[:, None], 1 + expected], 1)
        batch = (tokens.sum(0) / self.prices(rows).times).argmax()
        if not self.keyed:
            return batch.expand(rows)
        return torch.where(self.own, (tokens / self.prices(1).times).argmax(1), batch)

    def prices(self, rows: int) -> BatchPrices:
        if rows not in self.priced:
            self.priced[rows] = BatchPrices.of(self.cost, rows, self.most, self.draft_limit.device)
        return self.priced[rows]

    def rationed(self, accepted_so_far: torch.Tensor) -> torch.Tensor:
        """The generated count from which the ration allows a row its next try: its tries, that one included,
        cost at most `TRY_ALLOWANCE` plus `LOSS_BOUND` of its AR forwards plus the `accepted_so_far` drafts (a
        forward saved each)."""
        per_try = self.prices(accepted_so_far.shape[0] + self.beside).tokens_per_try
        if self.keyed:
            per_try = torch.where(self.own, self.prices(1).tokens_per_try, per_try)
        return ((self.probes + 1) * per_try - (TRY_ALLOWANCE + accepted_so_far) / LOSS_BOUND).ceil().long()

    def probe(self, limit: torch.Tensor, generated: torch.Tensor) -> None:
        """Set the limit to `limit`, except that where a row at zero drafts has generated `try_at` tokens, every
        row at zero drafts tries one draft (the try widens the forward for all of them), but `own` rows, which try
        on their own. Every row that tries counts the try in its ration: one row's ration, not each row's, then
        sets how often the batch tries."""
        batch_tries = self.most > 0 and self.prices(limit.shape[0] + self.beside).tries_pay
        own_tries = self.keyed and self.most > 0 and self.prices(1).tries_pay
        if not (batch_tries or own_tries):
            self.draft_limit = limit
            return
        at_zero = limit == 0
        due = at_zero & (generated >= self.try_at)
        if self.keyed and not (batch_tries and own_tries):  # (unkeyed, no row is `own`)
            due &= self.own if own_tries else ~self.own
        joining = at_zero & due.any()
        if self.keyed:
            joining = due | joining & ~self.own
        self.probes = self.probes + joining
        self.draft_limit, known = limit.masked_fill(joining, 1), self.widths_of
        if known is not None and known[0] is limit:  # (a try's window: one draft, 3 slots, as `window_length` sets)
            self.widths_of = (self.draft_limit, known[1], known[2].masked_fill(joining, min(3, known[1])))

    def window_length(self, budget: torch.Tensor, window_size: int) -> torch.Tensor:
        """Window per row: `draft_limit + 2` slots (1 at zero drafts), at most `window_size`, within `budget`."""
        limit, known = self.draft_limit, self.widths_of
        if known is None or known[0] is not limit or known[1] != window_size:  # (limits are replaced, never edited)
            known = self.widths_of = (limit, window_size, (limit + 2).masked_fill(limit == 0, 1).clamp(max=window_size))
        return torch.minimum(known[2], budget)
