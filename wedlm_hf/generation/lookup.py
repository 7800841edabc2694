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
from .window import WindowState


@dataclass(frozen=True)
class PromptLookup:
    ngram: int
    """Tokens that must match: the row's last `ngram` tokens (ending in its certain token)."""
    tokens: int
    """The most tokens a match drafts."""

    def continuation(self, record: OutputRecord, state: WindowState) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row, the (rows, tokens) tokens that followed the latest earlier occurrence of its last n-gram, and
        how many of them there are (0: no match). A row's context is its prompt (without padding), its committed
        tokens and its certain token (window slot 0)."""
        n, device = self.ngram, state.window.device
        end = record.prompt_length + state.generated  # the certain token's column
        width = int(end.max()) + 1
        columns = torch.arange(width, device=device)
        ids = record.sequences[state.rows[:, None], columns.clamp(max=record.sequences.shape[1] - 1)[None]]
        ids = ids.scatter(1, end[:, None], state.window[:, :1])
        if width <= n:  # no row has an earlier n-gram yet
            return ids.new_zeros(ids.shape[0], self.tokens), torch.zeros_like(end)
        first = record.prompt_length - state.first_position  # the first real column (after the left padding)
        last_gram = ids.gather(1, (end[:, None] - n + 1 + torch.arange(n, device=device)).clamp(min=0))
        grams = ids.unfold(1, n, 1)  # (rows, width - n + 1, n): the n-gram starting at each column
        starts = columns[: grams.shape[1]]
        matches = (grams == last_gram[:, None]).all(-1)
        matches &= (starts >= first[:, None]) & (starts + n <= end[:, None])  # real tokens, strictly earlier
        matches &= (end - n + 1 >= first)[:, None]  # the row has n real tokens
        found = matches.any(1)
        latest = torch.where(matches, starts, -1).amax(1)
        source = latest + n
        count = torch.minimum(end + 1 - source, torch.full_like(end, self.tokens)).masked_fill(~found, 0)
        offsets = torch.arange(self.tokens, device=device)
        tokens = ids.gather(1, (source[:, None] + offsets).clamp(min=0, max=width - 1))
        return tokens, count
