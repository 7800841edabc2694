"""Drafts from the context (prompt lookup): where the row's last n tokens occurred before, in its prompt or its
output, the tokens that followed them there are likely to follow again (editing code, quoting a document).

Lossless mode verifies these drafts like any other (`lossless.py`); under sampling a lookup draft is a proposal
of probability 1 (q is one-hot), which speculative sampling accepts with probability p(token). One search serves
every row: the n-grams of the ids tensor (`unfold`) compared with each row's last n-gram, the latest earlier match
taken, no per-row loop.
"""

from dataclasses import dataclass

import torch

from .record import OutputRecord
from .window import WindowLayout, WindowState


@dataclass(frozen=True)
class PromptLookup:
    ngram: int
    """The longest n-gram tried: the row's last `ngram` tokens (ending in its certain token), else fewer."""
    tokens: int
    """The most tokens a match drafts."""

    def continuation(self, record: OutputRecord, state: WindowState) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row, the (rows, tokens) tokens that followed the latest earlier occurrence of its last n-gram (the
        longest of at most `ngram` tokens that occurred before), and how many of them there are (0: no match). A
        row's context is its prompt (without padding), its committed tokens and its certain token (slot 0)."""
        device = state.window.device
        end = record.prompt_length + state.generated  # the certain token's column
        width = int(end.max()) + 1
        columns = torch.arange(width, device=device)
        ids = record.sequences[state.rows[:, None], columns.clamp(max=record.sequences.shape[1] - 1)[None]]
        ids = ids.scatter(1, end[:, None], state.window[:, :1])
        first = record.prompt_length - state.first_position  # the first real column (after the left padding)
        found = torch.zeros_like(end, dtype=torch.bool)
        source = torch.zeros_like(end)
        for size in range(min(self.ngram, width - 1), 0, -1):  # the longest match, as transformers' lookup does
            last_gram = ids.gather(1, (end[:, None] - size + 1 + torch.arange(size, device=device)).clamp(min=0))
            grams = ids.unfold(1, size, 1)  # (rows, width - size + 1, size): the n-gram starting at each column
            starts = columns[: grams.shape[1]]
            matches = (grams == last_gram[:, None]).all(-1)
            matches &= (starts >= first[:, None]) & (starts + size <= end[:, None])  # real tokens, strictly earlier
            matches &= (end - size + 1 >= first)[:, None]  # the row has `size` real tokens
            latest = torch.where(matches, starts, -1).amax(1)
            source = torch.where(found, source, latest + size)
            found |= matches.any(1)
        count = torch.minimum(end + 1 - source, torch.full_like(end, self.tokens)).masked_fill(~found, 0)
        offsets = torch.arange(self.tokens, device=device)
        tokens = ids.gather(1, (source[:, None] + offsets).clamp(min=0, max=width - 1))
        return tokens, count

    def draft(
        self,
        record: OutputRecord,
        state: WindowState,
        layout: WindowLayout,
        eligible: torch.Tensor,
        draft_probs: torch.Tensor | None,
    ) -> torch.Tensor:
        """Put each `eligible` row's continuation in the slots after its certain token, the window growing to hold
        them and one mask slot (within `window_size` and max_new_tokens); with sampling, `draft_probs` gets their
        one-hot proposals. Returns which rows got drafts."""
        tokens, count = self.continuation(record, state)
        room = torch.clamp(state.max_new_tokens - state.generated, max=layout.window_size)
        count = torch.minimum(count, room - 1).masked_fill(~eligible, 0)
        size = min(self.tokens, layout.window_size - 1)
        placed = layout.slots[:, :size] < count[:, None]
        drafts = state.window[:, 1 : 1 + size]  # views: the drafts land in the state
        drafts.copy_(torch.where(placed, tokens[:, :size], drafts))
        state.fill_step[:, 1 : 1 + size].masked_fill_(placed, record.steps)
        if draft_probs is not None:
            probs = draft_probs[:, 1 : 1 + size]
            one_hot = torch.zeros_like(probs).scatter_(-1, tokens[:, :size, None], 1.0)
            probs.copy_(torch.where(placed[..., None], one_hot, probs))
        state.length = torch.where(count > 0, torch.maximum(state.length, torch.minimum(count + 2, room)), state.length)
        return count > 0
