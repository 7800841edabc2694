"""What the penalties read: OpenAI's frequency and presence penalties as a transformers logits processor (for
`generate()`), and `SeenTokens`, the counts per scored position that per-row sampling (sampling.py) applies
transformers' repetition penalty and OpenAI's penalties with, densely."""

from dataclasses import dataclass

import torch
from transformers import LogitsProcessor


class OpenAIPenalties(LogitsProcessor):
    """OpenAI's frequency and presence penalties: logit[t] -= frequency * count(t) + presence * [count(t) > 0],
    over the tokens after the first `prompt_length` (the output so far)."""

    def __init__(self, prompt_length: int, frequency: float, presence: float):
        self.prompt_length, self.frequency, self.presence = prompt_length, frequency, presence

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        output = input_ids[:, self.prompt_length :]
        counts = torch.zeros_like(scores).scatter_add_(1, output, torch.ones_like(output, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


@dataclass
class SeenTokens:
    """What the penalties read at each scored position: counts (n, positions, vocab) of the tokens before it,
    prompt and output (`context`, repetition penalty) and output only (`output`, OpenAI's penalties); a kind no
    row's penalty reads is None (not built: a (rows, vocab) scatter, and in verification a (rows, positions,
    vocab) sum, saved per step)."""

    context: torch.Tensor | None
    output: torch.Tensor | None

    def of_rows(self, rows: torch.Tensor) -> "SeenTokens":
        return SeenTokens(*(None if counts is None else counts[rows] for counts in (self.context, self.output)))

    @classmethod
    def before(
        cls, sequences: torch.Tensor, vocab_size: int, prompt_length: int, committed: torch.Tensor,
        first_real: torch.Tensor, drafts: torch.Tensor | None = None, *, context: bool, output: bool,
    ) -> "SeenTokens":
        """`sequences` (n, columns): the rows' records; each row's tokens before column `committed` (n,), from
        `first_real` (the first column that is not padding, or 0), and at position j also `drafts[:, :j]`.
        `context` / `output`: whether to count that kind."""
        columns = torch.arange(sequences.shape[1], device=sequences.device)[None]
        counted = (columns < committed[:, None]) & (columns >= first_real[:, None])
        zeros = torch.zeros(sequences.shape[0], vocab_size, device=sequences.device)
        kinds = []
        if context:
            kinds.append(counted)
        if output:
            kinds.append(counted & (columns >= prompt_length))
        seen = [zeros.scatter_add(1, sequences, which.float())[:, None] for which in kinds]
        if drafts is not None and drafts.shape[1]:
            shape = (drafts.shape[0], drafts.shape[1] + 1, vocab_size)
            drafted = torch.zeros(shape, device=drafts.device)
            drafted[:, 1:].scatter_(2, drafts[..., None], 1.0)  # position j + 1 sees draft j too
            drafted = drafted.cumsum(1)
            seen = [counts + drafted for counts in seen]
        return cls(seen.pop(0) if context else None, seen.pop(0) if output else None)
