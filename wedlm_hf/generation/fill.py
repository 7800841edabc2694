"""Filling mask slots from a forward's logits: which slots (low entropy first, `selection.py`) and with which
tokens (argmax, or through the logits processors and sampling)."""

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
    ) -> None:
        """Fill the confident slots among the live, `fillable` ones of the first `window_size` slots; with sampling,
        `draft_probs` (rows, slots, vocab) receives the distribution each filled slot was drawn from.

        Entropy and the greedy argmax run once per logits column, dense; the slots then gather them. The
        forward's logits are this step's own: the mask column is cleared in place (the mask id is never a
        prediction, it would fill nothing) once the entropy, which includes it, is taken."""
        if logits.shape[1] == 0:  # every fed slot was filled: nothing to predict
            return
        window_size, scores = self.layout.window_size, state.scores
        candidates = fillable & (self.layout.slots[:, :window_size] < state.length[:, None])
        columns = slot_physical.clamp(0, logits.shape[1] - 1)
        if window_size == 1:  # one candidate at most: `choose_slots` would pick it whatever its entropy
            chosen = candidates
        else:
            entropy = slot_entropy(logits).gather(1, columns)
            settings = self.settings
            chosen = choose_slots(entropy, candidates, settings.entropy_threshold, settings.pos_penalty_factor)
        sampling = self.record.sampling
        if self.contiguous:
            run = ((state.window[:, :window_size] != self.layout.mask_id) | chosen).int().cumprod(1).bool()
            chosen &= run if sampling is None else run | ~sampling.sample[state.rows][:, None]
        slot_logits = gather_columns(logits, columns) if scores.keeps_logits else None
        logits[..., self.layout.mask_id] = float("-inf")
        if sampling is not None:
            tokens, slot_scores = self._choose_per_row(state, logits, columns, chosen, draft_probs)
        elif self.logits_processor or self.do_sample:
            tokens, slot_scores = self._choose_processed(state, logits, columns, chosen, draft_probs)
        else:
            tokens = logits.argmax(-1).gather(1, columns)
            slot_scores = gather_columns(logits, columns) if scores.keeps_scores else None
        window = state.window[:, :window_size]  # a view: the fills land in `state.window`
        window.copy_(torch.where(chosen, tokens, window))
        state.fill_step[:, :window_size].masked_fill_(chosen, self.record.steps)
        scores.fill(chosen, scores=slot_scores, logits=slot_logits)

    def _choose_per_row(
        self,
        state: WindowState,
        logits: torch.Tensor,
        columns: torch.Tensor,
        chosen: torch.Tensor,
        draft_probs: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`_choose_processed` for rows with their own sampling (`record.sampling`): the call's other processors
        (each slot with its row's committed context), then each row's penalties, warpers and draw, densely over
        every slot with no host read; but where a row samples on a device whose host reads are free
        (`HOST_READS_ARE_FREE`), over the chosen slots alone (sorting every slot's vocabulary for top-p costs more
        there than the read)."""
        sampling, record = self.record.sampling, self.record
        vocab_size = logits.shape[-1]
        if sampling.any_sample and logits.device.type in HOST_READS_ARE_FREE:
            rows, slots = chosen.nonzero(as_tuple=True)
            scores, index = logits[rows, columns[rows, slots]].float()[:, None], slots[:, None]
        else:
            rows, slots = torch.arange(chosen.shape[0], device=chosen.device), None
            scores, index = gather_columns(logits, columns).float(), None
        if self.logits_processor and rows.numel():
            processors = for_rows(self.logits_processor, state.rows[rows].repeat_interleave(scores.shape[1]))
            context = record.committed_context(state)[rows].repeat_interleave(scores.shape[1], dim=0)
            scores = processors(context, scores.flatten(0, 1)).view_as(scores)
        seen = sampling.seen(record, state, vocab_size)
        scores = sampling.processed(scores, state.rows[rows], None if seen is None else seen.of_rows(rows))
        forward = record.forward_numbers(state)[rows]
        tokens, probs = sampling.choose(scores, state.rows[rows], forward, FILL, index)
        if slots is None:  # every slot scored
            if draft_probs is not None and probs is not None:
                draft_probs.copy_(torch.where(chosen[..., None], probs, draft_probs))
            return tokens, scores if state.scores.keeps_scores else None
        if draft_probs is not None:
            draft_probs[rows, slots] = probs[:, 0]
        placed = torch.full_like(columns, self.layout.mask_id)
        placed[rows, slots] = tokens[:, 0]
        slot_scores = None
        if state.scores.keeps_scores:
            slot_scores = scores.new_zeros(*columns.shape, vocab_size)
            slot_scores[rows, slots] = scores[:, 0]
        return placed, slot_scores

    def _choose_processed(
        self,
        state: WindowState,
        logits: torch.Tensor,
        columns: torch.Tensor,
        chosen: torch.Tensor,
        draft_probs: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Tokens (and scores) of the chosen slots through the logits processors/warpers, with each slot's row's
        committed tokens as context, then argmax or a sample. Processors read that context on the host, so this
        path indexes the chosen slots only: vocabulary-wide processor work scales with the slots filled."""
        rows, slots = chosen.nonzero(as_tuple=True)
        scores = logits[rows, columns[rows, slots]]
        if self.logits_processor and rows.numel():  # (processors may not take an empty batch)
            processors = for_rows(self.logits_processor, state.rows[rows])
            scores = processors(self.record.committed_context(state)[rows], scores.float())
        if self.do_sample:
            probs = torch.softmax(scores.float(), dim=-1)
            picked = torch.multinomial(probs, 1).squeeze(1)
            if draft_probs is not None:
                draft_probs[rows, slots] = probs
        else:
            picked = scores.argmax(-1)
        tokens = torch.full_like(columns, self.layout.mask_id)
        tokens[rows, slots] = picked
        slot_scores = None
        if state.scores.keeps_scores:
            slot_scores = torch.zeros(*columns.shape, logits.shape[-1], dtype=scores.dtype, device=scores.device)
            slot_scores[rows, slots] = scores
        return tokens, slot_scores
