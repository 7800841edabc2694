"""Lossless WeDLM: parallel drafts verified by the same forward, so the output is exactly greedy AR decoding.

Causal attention makes verification free. The committed prefix ends in one *certain* token c (an AR argmax),
fed first in every window, followed by the leading drafted slots in logical order; the logits at c and at each
leading draft are therefore ordinary next-token logits. A draft is committed only while it equals the AR argmax
of the slot before it; at the first mismatch the AR token takes its place as the next certain token and every
slot after it returns to MASK (its prediction saw the wrong token). If all leading drafts pass, the AR logits of
the last one give the next certain token for free. Each forward thus commits at least one token, and the
committed tokens are the model's greedy AR continuation by construction.

New drafts come only from predictions that saw verified tokens: after a correction the row drafts nothing until
the next forward, which predicts its masks from the corrected prefix. (Drafting from the same forward would use
predictions conditioned on the rejected token, and a rejected slot's logits predict the slot after it; on the
embedded checkpoint's counting prompts, drafting at threshold 1.0, that gave 6.5 tokens per forward, not 10.3.)
"""


import torch

from .decoding import WindowDecoder
from .outputs import WeDLMStats

FIRST_AR_RUN = 4
LONGEST_AR_RUN = 64
"""Adaptive schedule: the fewest and the most AR-only forwards a row takes before it tries one draft again (a try
costs two wider forwards: one to draft, one to verify)."""


class LosslessDecoder(WindowDecoder):
    """Greedy AR by verification. Per row, `draft_limit` bounds the drafts a forward checks; a window of
    `draft_limit + 2` slots yields that many (the certain token, the drafts, and one mask whose prediction
    duplicates the certain token's AR prediction), and `draft_limit` 0 is one-token AR.

    `wedlm_draft_schedule="adaptive"` follows recent acceptance, as transformers' assisted generation adapts its
    draft length: start at the most (`window_size - 2`: a WeDLM-trained model's drafts are mostly right, and a
    small start cost 2 of 8 forwards on the embedded checkpoint's counting prompts); after a rejection before half
    the limit, as many as were accepted (a later rejection keeps it); after a forward that accepts every draft,
    double plus one, up to the most. A row at zero drafts runs AR and tries one draft again after `probe_wait`
    forwards, a wait that doubles (from `FIRST_AR_RUN` to `LONGEST_AR_RUN`) each time no draft is accepted and
    resets when one is.
    `"full"` drafts every slot of a `window_size` window, always.
    """

    COUNTERS = WindowDecoder.COUNTERS + ("drafted", "accepted", "corrected")
    ROW_STATE = WindowDecoder.ROW_STATE + COUNTERS[2:] + ("draft_limit", "ar_run", "probe_wait", "mask_predicted")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.do_sample:
            raise ValueError("`wedlm_lossless=True` reproduces greedy decoding; use do_sample=False.")
        if self.logits_processor:
            names = ", ".join(type(p).__name__ for p in self.logits_processor)
            raise ValueError(
                f"`wedlm_lossless=True` verifies drafts against plain greedy logits; remove the logits processors "
                f"({names}) or use `wedlm_lossless=False`."
            )
        self.drafted, self.accepted, self.corrected = (torch.zeros_like(self.generated) for _ in range(3))
        self.total_drafted, self.total_accepted, self.total_corrected = (
            torch.zeros_like(self.total_forwards) for _ in range(3)
        )
        self.adaptive = self.settings.draft_schedule == "adaptive"
        self.most_drafts = max(self.settings.window_size - 2, 0)
        self.draft_limit = torch.full_like(self.window_length, self.most_drafts)
        self.ar_run = torch.zeros_like(self.window_length)
        self.probe_wait = torch.full_like(self.window_length, FIRST_AR_RUN)
        self.mask_predicted = torch.zeros_like(self.done)
        """A row whose greedy next token was the mask id (reported at the next sync: lossless cannot go on)."""
        self._limit_window()

    def run(self) -> None:
        none = torch.zeros_like(self.window_length)
        step = self._begin_step(self.window_length.clone())
        if step is None:
            return
        fed, keep, (length,), _ = step
        logits, physical = self._feed(length, self.generated, fed, keep)
        self.cache_commit = none
        slot_physical = self._shift(none, length, physical)
        self._place_certain(self.prompt_logits.argmax(-1), self.prompt_logits)
        self._fill(logits, slot_physical, self._fillable())
        while self._verify_step():
            pass

    def _fillable(self) -> torch.Tensor:
        window = self.window[:, : self.settings.window_size]
        return (window == self.mask_id) & (self.slots[:, : self.settings.window_size] >= 1)

    def _place_certain(self, tokens: torch.Tensor, logits: torch.Tensor) -> None:
        """Slot 0 gets the AR token, with the logits it is the argmax of as its scores and logits."""
        self.mask_predicted |= tokens == self.mask_id
        self.window[:, 0] = tokens
        self.window_fill_step[:, 0] = self.stats.model_calls
        for kept in (self.window_scores, self.window_logits):
            if kept is not None:
                kept[:, 0] = logits.to(kept.dtype)

    def _verify_step(self) -> bool:
        # 1. the certain token is committed now; its K/V come from the forward below
        num_leading = self._leading_filled()
        generated_before = self.generated
        self.done |= self._commit(torch.ones_like(num_leading))
        # 2. one forward: next-token logits at the certain token and at every leading draft, plus as many extra
        #    mask slots as there are drafts, so that if all are accepted the next window is already predicted
        window_size = self.settings.window_size
        drafts = num_leading - 1
        budget = self.max_new_tokens - generated_before - self.window_length
        length = self.window_length + torch.minimum(drafts, budget)
        step = self._begin_step(length, drafts, generated_before, checks=[self.mask_predicted.any()])
        if step is None:
            return False
        fed, masks, (length, drafts, generated_before), (mask_predicted,) = step
        if mask_predicted:
            raise ValueError(
                "The model's greedy next token is the mask token; `wedlm_lossless=True` needs a model that never "
                "emits `mask_token_id` as a next token (any WeDLM-trained checkpoint)."
            )
        logits, physical = self._feed(length, generated_before, fed, fed)
        ar_columns = physical[:, :window_size].clamp(max=fed - 1)  # the certain token's and each draft's column
        ar_tokens = logits.argmax(-1).gather(1, ar_columns)
        matches = (self.window[:, 1:window_size] == ar_tokens[:, : window_size - 1]) & (
            self.slots[:, : window_size - 1] < drafts[:, None]
        )
        accepted = matches.int().cumprod(1).sum(1)
        corrected = accepted < drafts
        self.drafted = self.drafted + drafts
        self.accepted = self.accepted + accepted
        self.corrected = self.corrected + corrected
        # 3. commit the accepted drafts (their K/V are this forward's), then the AR token becomes certain; each
        #    committed token carries the AR logits it is the argmax of (the slot before it)
        ar_logits = self._gather_columns(logits, ar_columns) if self.keep_scores or self.keep_logits else None
        for kept in (self.window_scores, self.window_logits):
            if kept is not None:
                kept[:, 1:window_size] = ar_logits[:, : window_size - 1].to(kept.dtype)
        if fed > 1:  # an AR-only forward (one column per row) verified no drafts: nothing more to commit
            self.done |= self._commit(accepted, start=1)
        self.cache_commit = 1 + accepted
        next_certain = ar_tokens.gather(1, accepted[:, None]).squeeze(1)
        certain_logits = None if ar_logits is None else self._gather_columns(ar_logits, accepted[:, None]).squeeze(1)
        slot_physical = self._shift(1 + accepted, length, physical)
        after_mismatch = corrected[:, None] & (self.slots >= 1)
        self.window = self.window.masked_fill(after_mismatch, self.mask_id)
        self._place_certain(next_certain, certain_logits)
        # 4. new drafts from this forward's mask predictions; after a correction every one of them saw the rejected
        #    draft (and a rejected slot's logits predict the slot after it), so those rows draft in the next forward;
        #    only mask slots fill, and their logits are the last `masks` columns (none in an AR-only forward)
        if masks:
            self._fill(logits[:, fed - masks :], slot_physical - (fed - masks), self._fillable() & ~corrected[:, None])
        if self.adaptive:
            self._adapt(drafts, accepted, corrected)
        self._limit_window()
        return True

    def _adapt(self, drafts: torch.Tensor, accepted: torch.Tensor, corrected: torch.Tensor) -> None:
        """The adaptive schedule's update of `draft_limit` from this forward's verification (see the class)."""
        all_accepted = (drafts > 0) & ~corrected
        limit = torch.where(all_accepted, (2 * self.draft_limit + 1).clamp(max=self.most_drafts), self.draft_limit)
        limit = torch.where(corrected & (2 * accepted < self.draft_limit), accepted, limit)
        self.probe_wait = torch.where(
            accepted > 0,
            torch.full_like(self.probe_wait, FIRST_AR_RUN),
            torch.where(corrected, (2 * self.probe_wait).clamp(max=LONGEST_AR_RUN), self.probe_wait),
        )
        self.ar_run = torch.where(limit == 0, self.ar_run + 1, torch.zeros_like(self.ar_run))
        probe = (limit == 0) & (self.ar_run >= self.probe_wait)
        self.draft_limit = torch.where(probe, min(1, self.most_drafts), limit)

    def _limit_window(self) -> None:
        """Window per row: `draft_limit + 2` slots (1 at zero drafts), at most `window_size`, within
        max_new_tokens; slots past it return to MASK."""
        longest = self.settings.window_size
        if self.adaptive:
            wanted = torch.where(self.draft_limit == 0, 1, self.draft_limit + 2).clamp(max=longest)
        else:
            wanted = torch.full_like(self.window_length, longest)
        self.window_length = torch.minimum(wanted, self.max_new_tokens - self.generated)
        self.window = self.window.masked_fill(self.slots >= self.window_length[:, None], self.mask_id)

    def finish_stats(self) -> WeDLMStats:
        stats = super().finish_stats()
        stats.drafted = self.total_drafted.tolist()
        stats.accepted = self.total_accepted.tolist()
        stats.corrected = self.total_corrected.tolist()
        return stats
