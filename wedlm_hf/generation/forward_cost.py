"""What a decoding step costs as the tokens its forward carries grow: the one cost model that every choice of a
step's width reads (lossless mode's drafts and tries, plain mode's warning, the vLLM drafter's widths).

A step's time is modelled as `fixed + per_token * tokens`, `tokens` being every row's fed columns: a batched forward
pads each row to the widest, so B rows of C columns cost B * C however few of them a row needs. Only the ratio
matters, `scale = fixed / per_token`, the tokens a step carries for the price of its fixed part. Where a forward of
many tokens costs about what one of a single token does (an accelerator reads its weights once per step), `scale`
is in the thousands and every draft with a fair chance pays; on a CPU it is a few dozen tokens, so a 16-slot window
pays at batch 1 and not at batch 32.

A forward wider than one column per row may cost a jump more than the line says: on a CPU a one-token forward of a
model whose weights outgrow the caches runs matrix-vector products, and a second column moves every layer to
matrix-matrix kernels (SmolLM2-135M in float32, 1 thread, 2-vCPU AMD EPYC, 2026-12-07: 2 tokens per row 1.85x one
token at batch 1, 4 tokens 1.59x, 17 tokens 2.56x, `scripts/draft_adapter_cost.py`), which no scale expresses:
`premium` of the fixed part, paid by every wider forward. A step that verifies drafts also does more of the
decoder's own work around its forward than a one-column step does (some 140 small tensor ops against a dozen:
gathering, verifying, shifting, filling): `verify_share` of the fixed part.

The scale is declared per device type (`SCALES`, with no premium), or measured on the device for one model with its
premium (`cost_profile.py` times a few forwards and `fitted` fits both; the installed package stores them per device
and model, `cost_profiles/store.py`), or given per call (`wedlm_forward_scale`); `verify_share` is declared
(`VERIFY_SHARES`). This module imports only the standard library, so `wedlm_vllm` loads it by its path without
importing torch.
"""

import math
from dataclasses import dataclass

SCALES = {"cpu": 24}
"""`scale` per device type, declared. On a CPU, 20 to 32 tokens by the forward-cost table filed with issue 47
(embedded checkpoint, 1 thread, 64 tokens cached, 2-vCPU AMD EPYC, 2026-12-06): a forward of 17 tokens per row cost
1.76x one of 1 token at batch 1, 5.20x at batch 8, 9.06x at batch 32; `ForwardCost.relative` at 24 gives 1.64x,
5.00x and 10.1x."""
DEFAULT_SCALE = 2048
"""Other devices: an accelerator reads the weights once per step whatever its columns (declared, not measured)."""
VERIFY_SHARES = {"cpu": 0.25}
"""The decoder's extra work in a step that verifies drafts, as a share of the forward's fixed part, per device type:
on a CPU the lossless update after a forward of 3 or 4 columns took about 1 ms more than after a one-column forward,
against about 4 ms for a one-token forward of the embedded checkpoint (2-vCPU AMD EPYC, 2026-12-06)."""
DEFAULT_VERIFY_SHARE = 0.1
"""Other devices: the extra step work's kernel launches against a forward's (declared, not measured)."""


@dataclass(frozen=True)
class ForwardCost:
    """A step's time in units of one fed token's cost: `scale + tokens`, plus `(premium + verify_share) * scale`
    where the step verifies drafts (every such step feeds more than one column per row)."""

    scale: float
    verify_share: float
    premium: float = 0.0

    @classmethod
    def declared(cls, device_type: str, scale: float | None = None, premium: float = 0.0) -> "ForwardCost":
        """The device type's declared model; `scale` and `premium` (given or measured) replace its own."""
        return cls(
            scale=float(declared_scale(device_type) if scale is None else scale),
            verify_share=VERIFY_SHARES.get(device_type, DEFAULT_VERIFY_SHARE), premium=float(premium),
        )

    def step(self, tokens, verifies=False):
        """The time of a step feeding `tokens` in all (a number, or a tensor of them; `verifies` alike)."""
        return self.scale + tokens + (self.premium + self.verify_share) * self.scale * verifies

    def forward(self, rows: int, columns: int) -> float:
        """The time of the forward alone (no verifying work) of `columns` per row at `rows` rows."""
        return self.step(rows * columns) + self.premium * self.scale * (columns > 1)

    def relative(self, rows: int, columns: int) -> float:
        """A forward of `columns` per row as a multiple of a one-column forward, at `rows` rows (the forward alone,
        as issue 47's table measured it)."""
        return self.forward(rows, columns) / self.forward(rows, 1)

    def loses_from(self, columns: int, tokens: float) -> int | None:
        """The smallest batch size from which a step feeding `columns` per row and committing `tokens` per row
        (the decoder's work of a verifying step included) costs more than `tokens` one-column steps do; None where
        it pays at every batch size."""
        # scale (1 + premium + verify_share) + rows * columns > tokens * (scale + rows)
        #   <=>  rows * (columns - tokens) > scale * (tokens - 1 - premium - verify_share)
        if columns <= tokens:
            return None
        fixed_gain = self.scale * (tokens - 1 - self.premium - self.verify_share)
        return max(1, math.floor(fixed_gain / (columns - tokens)) + 1)

    def table(self, batches: tuple[int, ...], columns: tuple[int, ...]) -> list[tuple[int, list[float]]]:
        """`relative` for every batch size of `batches` and width of `columns`, one row per batch size."""
        return [(rows, [self.relative(rows, width) for width in columns]) for rows in batches]


def declared_scale(device_type: str) -> int:
    """The scale declared for `device_type` (`SCALES`, else `DEFAULT_SCALE`)."""
    return SCALES.get(device_type, DEFAULT_SCALE)


LARGEST_SCALE = 2**20
"""The largest scale `fitted` fits: a forward whose time does not measurably grow with its tokens."""
LARGEST_PREMIUM = 2.0
"""The largest premium `fitted` fits (a wider forward at three times the line's fixed part)."""


def fitted(samples: list[tuple[int, int, float]]) -> tuple[float, float]:
    """The scale and premium whose `relative` best match measured forwards, `samples` of (rows, columns per row,
    seconds): least squares on the logarithm of each forward's time over the one-column forward's at its batch size,
    over the scales 2^(k/8) up to `LARGEST_SCALE` and the premiums k/20 up to `LARGEST_PREMIUM` (a grid: the fit is
    the same for the same times; a forward that grows too little to measure fits the largest scale, no premium)."""
    one = {rows: seconds for rows, columns, seconds in samples if columns == 1}
    ratios = [
        (rows * columns, rows, math.log(seconds / one[rows]))
        for rows, columns, seconds in samples if columns > 1 and rows in one
    ]
    if not ratios:
        raise ValueError("fitting a forward's cost needs a one-column and a wider forward at one batch size at least")

    def error(fit: tuple[float, float]) -> float:
        scale, premium = fit
        return sum(
            (log_ratio - math.log((scale * (1 + premium) + fed) / (scale + rows))) ** 2
            for fed, rows, log_ratio in ratios
        )

    scales = [2 ** (step / 8) for step in range(8 * round(math.log2(LARGEST_SCALE)) + 1)]
    premiums = [step / 20 for step in range(round(20 * LARGEST_PREMIUM) + 1)]
    scale, premium = min(((scale, premium) for premium in premiums for scale in scales), key=error)
    return round(scale, 1), premium
