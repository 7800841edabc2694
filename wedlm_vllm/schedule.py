"""How many draft tokens a request adds to its next forward, read from its last forward alone.

A request's schedule is a function of what that forward fed (drafts, then mask slots) and what vLLM's rejection
sampler accepted, so the drafter keeps no state between forwards: nothing to key by request, nothing that two
engines or a reordered batch could mix up. It follows `wedlm_hf`'s adaptive draft schedule in spirit: a request
starts at `START_WIDTH`; a forward whose drafts all pass widens it (doubling, up to the slot budget), a rejection
narrows it to what was accepted (none accepted: one-token forwards, plain vLLM's cost), and a request at
one-token forwards tries two mask slots whenever its output length is a multiple of `PROBE_PERIOD` (at a batch
small enough for some draft to pay: `cost.pays_at`), so a model whose drafts start to pass again gets its width
back.
"""

from dataclasses import dataclass

START_WIDTH = 8
"""A new request's first width: a WeDLM-trained model reaches the budget two forwards later, and a model whose
drafts fail pays two forwards of at most 9 tokens before its first rejection instead of two of 25."""
PROBE_PERIOD = 64
"""A request at one-token forwards feeds two mask slots when its output length is a multiple of this (`wedlm_hf`'s
longest wait between probes): on a model whose drafts fail, a probe and the failed draft after it add 8 tokens to
two forwards per this many tokens."""


@dataclass(frozen=True)
class LastForward:
    """What one request's last forward fed after its first token, and what came back."""

    drafts: int
    """Tokens verified as drafts (mask-slot predictions or prompt-lookup continuations)."""
    masks: int
    """Mask slots fed after the drafts."""
    accepted: int
    """Drafts vLLM accepted (its sampled tokens minus one)."""
    prefill: bool
    """Whether the forward was the prompt's (last) chunk."""
    length: int
    """The request's output tokens after this forward."""


def next_width(last: LastForward, budget: int) -> int:
    """Draft tokens (drafts plus mask slots) for the request's next forward, at most `budget`; 0 means a plain
    one-token forward."""
    if last.prefill:
        return min(budget, START_WIDTH)
    if last.accepted < last.drafts:  # a rejection
        if last.masks == 0 or last.accepted == 0:
            return 0
        if 2 * last.accepted >= last.drafts:
            return last.drafts + last.masks
        return min(budget, 2 * last.accepted + 2)
    if last.masks == 0:  # a one-token forward, or prompt-lookup drafts only
        return min(budget, 2) if probes_at(last.length) else 0
    return min(budget, 2 * (last.drafts + last.masks) + 2)


def probes_at(length: int) -> bool:
    """Whether a request at one-token forwards with `length` output tokens probes in its next forward."""
    return length % PROBE_PERIOD == 0


def is_probe(last: LastForward, width: int) -> bool:
    """Whether `width` is the probe of a request at one-token forwards (exempt from pricing: two tokens now and
    then are what lets a width come back)."""
    return not last.prefill and last.drafts == last.masks == 0 and width > 0


DRAFT_SHARE = 0.5
"""The share of a request's draft tokens that are drafts (the rest are mask slots, `split`)."""


def gain_per_token(last: LastForward) -> float:
    """Accepted drafts expected per draft token (drafts and mask slots) of the request's next forward: the share of
    its drafts that passed in its last forward (all, where it verified none yet: a prompt step, mask slots alone)
    times `DRAFT_SHARE`. Acceptance, not the last forward's accepted count per token: a request widening from a
    prompt step feeds more mask slots than drafts for a forward or two."""
    passed = 1.0 if last.prefill or last.drafts == 0 else last.accepted / last.drafts
    return passed * DRAFT_SHARE


def split(width: int, predictions: int) -> tuple[int, int]:
    """(drafts, mask slots) for a forward of `width` draft tokens with `predictions` usable mask predictions:
    at most half the width drafts, so as many mask slots predict the next forward's drafts."""
    drafts = min(predictions, width // 2)
    return drafts, width - drafts


def mask_slots(spec_tokens, mask_token_id: int) -> int:
    """How many of a request's scheduled draft tokens are mask slots: the run of mask ids at their end."""
    tokens = list(spec_tokens)
    kept = len(tokens)
    while kept and tokens[kept - 1] == mask_token_id:
        kept -= 1
    return len(tokens) - kept
