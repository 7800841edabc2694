"""What the engine answered before, kept for drafting (`draft_history`): a workload that repeats itself (the same
prompts with small edits, templated requests, agents re-sending a conversation) has its next tokens in an earlier
request's text, and lossless decoding verifies such drafts as any other (`generation/lookup.py` searches them).

The newest texts are kept, up to a token budget: a text that does not fit pushes the oldest ones out.
"""

from collections import deque

import torch

SEPARATOR = -1
"""Follows each text: no n-gram matches across it, and a draft stops at it."""


class RequestHistory:
    def __init__(self, max_tokens: int, device: torch.device | str = "cpu"):
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"`draft_history` must be a number of tokens >= 1 (0 or None: no history), got {max_tokens!r}.")
        self.max_tokens, self.device = max_tokens, device
        self.texts: deque[list[int]] = deque()
        self.tokens = torch.empty(0, dtype=torch.long, device=device)
        """Every kept text, oldest first, each followed by `SEPARATOR` (the `TokenHistory` lookup searches)."""

    def add(self, prompt: list[int], output: list[int]) -> None:
        """Keep a finished request's prompt and output (its newest part, if the two alone exceed the budget)."""
        text = (prompt + output)[-(self.max_tokens - 1) :] + [SEPARATOR]
        self.texts.append(text)
        while sum(len(kept) for kept in self.texts) > self.max_tokens:
            self.texts.popleft()
        self.tokens = torch.tensor([token for kept in self.texts for token in kept], dtype=torch.long, device=self.device)
