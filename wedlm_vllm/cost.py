"""What a step of vLLM costs as its tokens grow, measured on the steps it runs, and which requests' drafts pay for
their tokens at the batch's size.

A step's time is modelled as `fixed + per_token * tokens` (the tokens every request feeds, prompts included). Only
their ratio matters: `scale = fixed / per_token`, the tokens a step carries for the price of its fixed part. Where a
step of many tokens costs about what a step of one does (a GPU reading its weights once per step), `scale` is in
the thousands and every draft pays; on a CPU it is a few dozen tokens (20-32 measured for the embedded checkpoint on
a 2-vCPU EPYC, docs/benchmarks.md), so at 32 requests a step of 1 + 24 tokens per request costs more than its
accepted drafts save.

With B requests, each request r feeding w_r draft tokens (drafts and mask slots) expected to gain e_r accepted
tokens, a step returns B + sum(e) tokens for a time proportional to scale + B + sum(w). `priced` keeps a request's
width where its own gain per token beats the step's, taking the best first.
"""

import statistics
from collections import deque
from dataclasses import dataclass, field

PRIOR_SCALE = {"cpu": 24.0}
"""`scale` before the steps have measured it, per device type; other devices: `DEFAULT_PRIOR_SCALE`."""
DEFAULT_PRIOR_SCALE = 2048.0
"""An accelerator reads the weights once per step whatever its columns (a declared figure, not measured here)."""
DECAY = 0.995
"""Weight kept by the fit per step: about the last 200 steps count."""
MIN_SPREAD = 16.0
"""The fit is trusted once the steps it weighs differ in size by this many tokens (standard deviation)."""
SCALE_BOUNDS = (1.0, 65536.0)
DRAFT_SHARE = 0.5
"""The share of a request's draft tokens that are drafts in its steady state (the rest are mask slots): its
expected gain is its acceptance rate times this share of its width."""


@dataclass
class StepCost:
    """A decayed least-squares fit of step seconds against step tokens; `scale` falls back to the prior until the
    steps seen differ enough in size, and a fixed `override` (the drafter's `forward_scale` option) wins."""

    prior: float
    override: float | None = None
    sums: list[float] = field(default_factory=lambda: [0.0] * 5)
    """Decayed weight, sum of tokens, of seconds, of tokens squared, of tokens times seconds."""
    recent: deque = field(default_factory=lambda: deque(maxlen=32))
    """Seconds per (tokens + prior) of the last steps kept: what tells a step from an idle gap."""

    def observe(self, tokens: int, seconds: float) -> None:
        """One step's tokens and seconds; a time far above the recent steps' is the engine sitting idle between
        two steps, not their cost, and is left out."""
        normalized = seconds / (tokens + self.prior)
        if len(self.recent) >= 3 and normalized > 5 * statistics.median(self.recent):
            return
        self.recent.append(normalized)
        self.sums = [DECAY * total + value for total, value in
                     zip(self.sums, (1.0, tokens, seconds, tokens * tokens, tokens * seconds))]

    def _fit(self) -> tuple[float, float] | None:
        weight, tokens, seconds, squares, products = self.sums
        if weight < 8:
            return None
        mean_tokens, mean_seconds = tokens / weight, seconds / weight
        variance = squares / weight - mean_tokens**2
        if variance < MIN_SPREAD**2:
            return None
        per_token = (products / weight - mean_tokens * mean_seconds) / variance
        return mean_seconds - per_token * mean_tokens, per_token

    @property
    def scale(self) -> float:
        if self.override is not None:
            return self.override
        fit = self._fit()
        if fit is None or fit[1] <= 0:
            return self.prior
        return min(max(fit[0] / fit[1], SCALE_BOUNDS[0]), SCALE_BOUNDS[1])


def priced(widths: list[int], acceptance: list[float], scale: float) -> list[int]:
    """`widths` with the requests whose drafts do not pay at this batch set to 0. A request's gain per draft token
    is its acceptance times `DRAFT_SHARE`; requests join best first while that beats the step's tokens per unit of
    time (`(B + gains) / (scale + B + widths)`, B the requests)."""
    kept = [0] * len(widths)
    returned, cost = float(len(widths)), scale + len(widths)
    for index in sorted(range(len(widths)), key=lambda i: -acceptance[i]):
        gain = acceptance[index] * DRAFT_SHARE * widths[index]
        if widths[index] and gain * cost > returned * widths[index]:
            kept[index] = widths[index]
            returned, cost = returned + gain, cost + widths[index]
    return kept
