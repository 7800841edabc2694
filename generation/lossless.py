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


class LosslessDecoder(WindowDecoder):
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
        self.total_drafted, self.total_accepted, self.total_corrected = (
            torch.zeros_like(self.total_forwards) for _ in range(3)
        )

    def run(self) -> None:
        none = torch.zeros_like(self.window_length)
        length = self.window_length.clone()
        logits, physical, fed = self._feed(length, self.generated)
        self.cache.commit(none, fed)
        slot_physical = self._shift(none, length, physical)
        self._place_certain(self.prompt_logits.argmax(-1))
        self._fill(logits, slot_physical, self._fillable())
        while self.rows.numel():
            self._verify_step()

    def _fillable(self) -> torch.Tensor:
        window = self.window[:, : self.settings.window_size]
        return (window == self.mask_id) & (self.slots[None, : self.settings.window_size] >= 1)

    def _place_certain(self, tokens: torch.Tensor) -> None:
        if bool((tokens == self.mask_id).any()):
            raise ValueError(
                "The model's greedy next token is the mask token; `wedlm_lossless=True` needs a model that never "
                "emits `mask_token_id` as a next token (any WeDLM-trained checkpoint)."
            )
        self.window[:, 0] = tokens
        self.window_fill_step[:, 0] = self.stats.model_calls

    def _verify_step(self) -> None:
        # 1. the certain token is committed now; its K/V come from the forward below
        num_leading = self._leading_filled()
        generated_before = self.generated.clone()
        continuing = ~self._commit(torch.ones_like(num_leading))
        if not bool(continuing.all()):
            self._drop_rows(continuing)
            num_leading, generated_before = num_leading[continuing], generated_before[continuing]
            if not self.rows.numel():
                return
        # 2. one forward: next-token logits at the certain token and at every leading draft, plus as many extra
        #    mask slots as there are drafts, so that if all are accepted the next window is already predicted
        window_size = self.settings.window_size
        drafts = num_leading - 1
        budget = self.max_new_tokens - generated_before - self.window_length
        length = self.window_length + torch.minimum(drafts, budget)
        logits, physical, fed = self._feed(length, generated_before, filled_logits=True)
        ar_physical = physical[:, :window_size].clamp(max=fed - 1)
        ar_tokens = logits.gather(1, ar_physical[..., None].expand(-1, -1, logits.shape[-1])).argmax(-1)
        matches = (self.window[:, 1:window_size] == ar_tokens[:, : window_size - 1]) & (
            self.slots[None, : window_size - 1] < drafts[:, None]
        )
        accepted = matches.int().cumprod(1).sum(1)
        corrected = accepted < drafts
        self.total_drafted[self.rows] += drafts
        self.total_accepted[self.rows] += accepted
        self.total_corrected[self.rows] += corrected.long()
        # 3. commit the accepted drafts (their K/V are this forward's), then the AR token becomes certain
        finished = self._commit(accepted, start=1)
        self.cache.commit(1 + accepted, fed)
        next_certain = ar_tokens.gather(1, accepted[:, None]).squeeze(1)
        slot_physical = self._shift(1 + accepted, length, physical)
        after_mismatch = corrected[:, None] & (self.slots[None, :] >= 1)
        self.window = self.window.masked_fill(after_mismatch, self.mask_id)
        self._place_certain(next_certain)
        # 4. new drafts from this forward's mask predictions; after a correction every one of them saw the rejected
        #    draft (and a rejected slot's logits predict the slot after it), so those rows draft in the next forward
        self._fill(logits, slot_physical, self._fillable() & ~corrected[:, None])
        self.window_length = torch.minimum(
            torch.full_like(self.window_length, window_size), self.max_new_tokens - self.generated
        )
        self.window = self.window.masked_fill(self.slots[None, :] >= self.window_length[:, None], self.mask_id)
        if bool(finished.any()):
            self._drop_rows(~finished)

    def finish_stats(self) -> WeDLMStats:
        stats = super().finish_stats()
        stats.drafted = self.total_drafted.tolist()
        stats.accepted = self.total_accepted.tolist()
        stats.corrected = self.total_corrected.tolist()
        return stats
