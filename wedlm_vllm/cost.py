"""What a step of vLLM costs as its tokens grow, and which requests' drafts pay for their tokens at the batch's size.

A step's time is modelled as `fixed + per_token * tokens` (the tokens every request feeds). Only their ratio
matters: `scale = fixed / per_token`, the tokens a step carries for the price of its fixed part. Where a step of
many tokens costs about what a step of one does (an accelerator reads its weights once per step), `scale` is in
the thousands and every draft pays; on a CPU it is a few dozen tokens, so at 32 requests a step of 1 + 24 tokens
per request costs more than its accepted drafts save. The scales are `wedlm_hf`'s (`generation/forward_cost.py`,
loaded by its path), one table for both packages.

With B requests, each request r feeding w_r draft tokens (drafts and mask slots) expected to gain g_r accepted
tokens per draft token (`schedule.gain_per_token`), a step returns B + sum(g * w) tokens for a time
proportional to scale + B + sum(w). `priced` keeps a request's width where its own gain per token beats the step's,
taking the best first.
"""

from . import hf_files
from .schedule import DRAFT_SHARE

forward_cost = hf_files.load("generation/forward_cost.py")
"""`wedlm_hf`'s cost model, whose declared scales (`SCALES`, `DEFAULT_SCALE`) the drafter prices with too."""


def forward_scale(device_type: str, override: int | None = None) -> int:
    """The scale the drafter prices with: `override` (the `forward_scale` option), else the device type's."""
    return override if override is not None else forward_cost.declared_scale(device_type)


def pays_at(requests: int, scale: float) -> bool:
    """Whether any width can pay at a step of `requests` requests: the best a draft token can gain is
    `DRAFT_SHARE` (every draft passing), and the first request `priced` keeps needs `gain * (scale + B) > B`,
    so from `B = scale * DRAFT_SHARE / (1 - DRAFT_SHARE)` on no request drafts, whatever its acceptance."""
    return requests * (1 - DRAFT_SHARE) < DRAFT_SHARE * scale


def priced(widths: list[int], gains: list[float], scale: float) -> list[int]:
    """`widths` with the requests whose drafts do not pay at this batch set to 0: requests join best gain per draft
    token first while it beats the step's tokens per unit of time (`(B + gains) / (scale + B + widths)`, B the
    requests)."""
    kept = [0] * len(widths)
    returned, cost = float(len(widths)), scale + len(widths)
    for index in sorted(range(len(widths)), key=lambda i: -gains[i]):
        gain = gains[index] * widths[index]
        if widths[index] and gain * cost > returned * widths[index]:
            kept[index] = widths[index]
            returned, cost = returned + gain, cost + widths[index]
    return kept
