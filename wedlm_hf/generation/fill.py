"""Filling mask slots from a forward's logits: which slots (low entropy first, `selection.py`) and with which
tokens (argmax, or through the logits processors and sampling)."""

import math
from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList

from .processors import for_rows
from .record import OutputRecord
from .sampling import FILL
from .selection import choose_slots, slot_entropy
from .settings import WeDLMSettings
from .window import WindowLayout, WindowState


HOST_READS_ARE_FREE = ("cpu",)
"""Devices with no queue to stall: a host read costs there only its own time."""


def gather_columns(logits: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """(rows, slots, vocab): each slot's logits row, `columns` (rows, slots) indexing `logits`' columns."""
    return logits.gather(1, columns[..., None].expand(-1, -1, logits.shape[-1]))


@dataclass
class SlotFiller:
    layout: WindowLayout
    settings: WeDLMSettings
    record: OutputRecord
    """Gives the step number (fill traces) and the committed context logits processors see."""
    logits_processor: LogitsProcessorList
    do_sample: bool
    contiguous: bool = False
    """Fill only slots that leave the window's filled slots one leading run (lossless sampling: each draft's q then
    depends on the tokens before it only, which speculative sampling needs)."""

    def fill(
        self,
        state: WindowState,
        logits: torch.Tensor,
        slot_physical: torch.Tensor,
        fillable: torch.Tensor,
        draft_probs: torch.Tensor | None = None,
        with_entropy: bool = False,
    ) -> torch.Tensor | None:
        """Fill the confident slots among the live, `fillable` ones of the first `window_size` slots; with sampling,
        `draft_probs` (rows, slots, vocab) receives the distribution each filled slot was drawn from. Returns the
        (rows, window_size) entropy of each slot's prediction where it chose by it or `with_entropy` asks for it
        (callers that weigh the predictions too), else None: one slot, or an infinite threshold (lossless mode's
        drafting), fills every candidate without it.

        Entropy and the greedy argmax run once per logits column, dense; the slots then gather them. The
        forward's logits are this step's own: the mask column is cleared in place (the mask id is never a
        prediction, it would fill nothing) once the entropy, which includes it, is taken."""
        if logits.shape[1] == 0:  # every fed slot was filled: nothing to predict
            return None
        window_size, scores = self.layout.window_size, state.scores
        candidates = fillable & (self.layout.slots[:, :window_size] < state.length[:, None])
        columns = slot_physical.clamp(0, logits.shape[1] - 1)
        entropy, threshold = None, self.settings.entropy_threshold
        if window_size == 1 or (threshold == math.inf and not with_entropy):  # `choose_slots` would pick them all
            chosen = candidates
        else:
            entropy = slot_entropy(logits).gather(1, columns)
            chosen = choose_slots(entropy, candidates, threshold, self.settings.pos_penalty_factor)
        sampling = self.record.sampling
        if self.contiguous:
            run = ((state.window[:, :window_size] != self.layout.mask_id) | chosen).int().cumprod(1).bool()
            chosen &= run if sampling is None else run | ~sampling.sample[state.rows][:, None]
        slot_logits = gather_columns(logits, columns) if scores.keeps_logits else None
        logits[..., self.layout.mask_id] = float("-inf")
        if sampling is not None or self.logits_processor or self.do_sample:
            tokens, slot_scores = self._choose_processed(state, logits, columns, chosen, draft_probs)
        else:
            tokens = logits.argmax(-1).gather(1, columns)
            slot_scores = gather_columns(logits, columns) if scores.keeps_scores else None
        window = state.window[:, :window_size]  # a view: the fills land in `state.window`
        window.copy_(torch.where(chosen, tokens, window))
        state.fill_step[:, :window_size].masked_fill_(chosen, self.record.steps)
        scores.fill(chosen, scores=slot_scores, logits=slot_logits)
        return entropy

    def _choose_processed(
        self,
        state: WindowState,
        logits: torch.Tensor,
        columns: torch.Tensor,
        chosen: torch.Tensor,
        draft_probs: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Tokens (and scores) of the chosen slots through the logits processors (each slot with its row's
        committed tokens as context), then each row's own sampling (`record.sampling`: penalties, warpers, keyed
        draws) or the call's argmax or sample.

        Which slots are scored: the chosen ones (one host read: which), or every slot densely, with no host read,
        where rows have their own sampling and none samples, or the device's host reads stall it
        (`HOST_READS_ARE_FREE`: on a CPU, sorting every slot's vocabulary for top-p costs more than the read)."""
        sampling, record = self.record.sampling, self.record
        vocab_size = logits.shape[-1]
        dense = sampling is not None and not (sampling.any_sample and logits.device.type in HOST_READS_ARE_FREE)
        if dense:
            rows, slots = torch.arange(chosen.shape[0], device=chosen.device), None
            scores = gather_columns(logits, columns).float()
        else:
            rows, slots = chosen.nonzero(as_tuple=True)
            scores = logits[rows, columns[rows, slots]].float()[:, None]
        if self.logits_processor and rows.numel():  # (processors may not take an empty batch)
            processors = for_rows(self.logits_processor, state.rows[rows].repeat_interleave(scores.shape[1]))
            context = record.committed_context(state)[rows].repeat_interleave(scores.shape[1], dim=0)
            scores = processors(context, scores.flatten(0, 1)).view_as(scores)
        if sampling is not None:
            seen = sampling.seen(record, state, vocab_size)
            scores = sampling.processed(scores, state.rows[rows], None if seen is None else seen.of_rows(rows))
            index = None if dense else slots[:, None]
            tokens, probs = sampling.choose(scores, state.rows[rows], record.forward_numbers(state)[rows], FILL, index)
        elif self.do_sample:
            probs = torch.softmax(scores, dim=-1)
            tokens = torch.multinomial(probs.flatten(0, 1), 1).view(probs.shape[:-1])
        else:
            tokens, probs = scores.argmax(-1), None
        if dense:
            if draft_probs is not None and probs is not None:
                draft_probs.copy_(torch.where(chosen[..., None], probs, draft_probs))
            return tokens, scores if state.scores.keeps_scores else None
        if draft_probs is not None and probs is not None:
            draft_probs[rows, slots] = probs[:, 0]
        placed = torch.full_like(columns, self.layout.mask_id)
        placed[rows, slots] = tokens[:, 0]
        slot_scores = None
        if state.scores.keeps_scores:
            slot_scores = scores.new_zeros(*columns.shape, vocab_size)
            slot_scores[rows, slots] = scores[:, 0]
        return placed, slot_scores
