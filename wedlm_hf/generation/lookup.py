"""Drafts from the context (prompt lookup): where the row's last n tokens occurred before, in its prompt or its
output, the tokens that followed them there are likely to follow again (editing code, quoting a document).

Lossless mode verifies these drafts like any other (`lookup_drafts.py`), from the first forward on: before it, the
prompt's last n-gram drafts the first window, as transformers' prompt lookup proposes candidates in its first
forward. Under sampling a lookup draft is a proposal of probability 1 (q is one-hot), which speculative sampling
accepts with probability p(token). One search serves every row and every n-gram size: at each column of the ids
tensor, how many of the tokens ending there equal the row's last ones (`unfold`, a running product), the longest
such match taken, at its latest and its earliest column; no loop over rows or sizes. With a history
(`TokenHistory`: the texts of requests a server answered before, as vLLM's suffix drafts and SuffixDecoding use
them), its n-grams are searched the same way, for repetitive workloads (a repeated request's prefill then drafts
the earlier answer).
"""

from dataclasses import dataclass
from typing import Protocol

import torch

from . import fill
from .record import OutputRecord
from .window import WindowLayout, WindowState


SHORTEST_MATCH = {"cpu": 2}
"""Per device type, the fewest tokens a match must have before its continuation drafts, unless the call sets
`wedlm_prompt_lookup_min_ngram` (at most the n-gram size): on a CPU every fed column is compute, and a continuation
found after the last token alone passes too rarely to pay for its columns (docs/benchmarks.md, "One-token matches
on a CPU"). Elsewhere any match drafts, as transformers' prompt lookup drafts after a one-token match (declared: a
decoding forward there is bound by reading the weights, not by its columns)."""


class TokenHistory(Protocol):
    """Text other than the row's own that drafts may come from (continuous batching: the requests answered
    before, `continuous/history.py`)."""

    tokens: torch.Tensor
    """(n,) token ids, each earlier text followed by -1 (a separator no n-gram matches across)."""


@dataclass(frozen=True)
class PromptLookup:
    ngram: int
    """The longest n-gram tried: the row's last `ngram` tokens (ending in its certain token), else fewer."""
    tokens: int
    """The most tokens a match drafts."""
    history: TokenHistory | None = None
    """Earlier texts searched too: at each n-gram size after the row's own context, so the longest match wins
    and the row's own text wins a tie."""
    matches: int = 2
    """How many occurrences `continuation` returns: the latest, the earliest, then the next latest ones."""
    min_ngram: int | None = None
    """The shortest match that drafts (at most `ngram`); None: the device's `SHORTEST_MATCH`."""

    def continuation(
        self, record: OutputRecord, state: WindowState, prefill: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Per row, the (rows, matches, tokens) tokens that followed earlier occurrences of its last n-gram (the longest
        of at most `ngram` tokens that occurred before, of at least `min_ngram`): the latest, the earliest, then the
        next latest ones; and how many of them there are (rows, matches) (0: no such occurrence; a match in the history
        is its latest, in every place). A row's context is its prompt (without padding), its committed tokens and its
        certain token (slot 0); before the first forward (`prefill`) its prompt alone, which ends at the same column in
        every row (no host read). Where an edit repeats a text, the latest occurrence is the one being rewritten; where
        a pattern recurs, the earliest may have gone on longer; where a line recurs with other endings (arguments,
        fields), the next latest ones hold them. None where no row has a match, when the device reads the host freely
        (no history, not in the prefill): the many steps of a text that repeats nothing then skip the drafts' gathering
        and the tree's proposal."""
        device = state.window.device
        end = record.prompt_length + state.generated - int(prefill)  # the certain (or last prompt) token's column
        reads_host = not prefill and device.type in fill.HOST_READS_ARE_FREE
        if prefill:
            width = record.prompt_length
        elif reads_host:  # up to the longest context, read on the host
            width = int(end.max()) + 1
        else:  # every column (those past a row's context never match): a read would stall the device's queue
            width = record.sequences.shape[1]
        columns, ids = torch.arange(width, device=device), record.sequences[state.rows, :width]
        if not prefill:
            ids = ids.scatter(1, end[:, None], state.window[:, :1])
        first = record.prompt_length - state.first_position  # the first real column (after the left padding)
        suffixes = _suffixes(ids, self.ngram)
        last = suffixes.gather(1, end[:, None, None].expand(-1, 1, self.ngram))  # (rows, 1, ngram)
        real = (end - first + 1).clamp(min=0)  # the row's tokens up to `end`: its last n-gram is no longer
        own = _match_lengths(suffixes, last, real)
        own = torch.minimum(own, (columns - first[:, None] + 1).clamp(min=0)).masked_fill(columns >= end[:, None], 0)
        shortest = min(self.min_ngram or SHORTEST_MATCH.get(device.type, 1), self.ngram)
        best = own.amax(1)  # the longest match, as transformers' lookup tries the longest n-gram first
        best = best.masked_fill(best < shortest, 0)
        if reads_host and self.history is None and not best.any():
            return None
        hit = (own == best[:, None]) & (best > 0)[:, None]
        ends = _occurrences(hit, columns, self.matches)
        source, found = ends + 1, ends >= 0
        corpus = None if self.history is None else self.history.tokens.to(device)
        from_history = torch.zeros_like(found)
        if corpus is not None and corpus.numel():
            earlier = _match_lengths(_suffixes(corpus[None], self.ngram), last, real)
            longest = earlier.amax(1)
            longest = longest.masked_fill(longest < shortest, 0)
            latest = torch.where(earlier == longest[:, None], torch.arange(corpus.numel(), device=device), -1).amax(1)
            from_history = longest > best  # a longer match wins; the row's own text wins a tie
            source = torch.where(from_history[:, None], latest[:, None] + 1, source)
            found |= from_history[:, None]
        at = source[..., None] + torch.arange(self.tokens, device=device)  # (rows, matches, tokens)
        tokens = ids.gather(1, at.flatten(1).clamp(min=0, max=width - 1)).view(at.shape)
        count = (end[:, None] + 1 - source).clamp(max=self.tokens)
        if corpus is not None and corpus.numel():
            told = corpus[at.clamp(max=corpus.numel() - 1)].masked_fill(at >= corpus.numel(), -1)
            in_text = (told >= 0).int().cumprod(-1)  # up to the end of that earlier text
            tokens = torch.where(from_history[:, None, None], told.clamp(min=0), tokens)
            count = torch.where(from_history[:, None], in_text.sum(-1), count)
        return tokens, count.masked_fill(~found, 0)

    def draft(
        self,
        record: OutputRecord,
        state: WindowState,
        layout: WindowLayout,
        eligible: torch.Tensor,
        draft_probs: torch.Tensor | None,
        prefill: bool = False,
    ) -> torch.Tensor:
        """Put each `eligible` row's continuation in the slots after its certain token (`prefill`: from slot 0, the
        continuation of the prompt, before the first forward), the window growing to hold them and one mask slot
        (within `window_size` and max_new_tokens); with sampling, `draft_probs` gets their one-hot proposals.
        Returns which rows got drafts."""
        found = self.continuation(record, state, prefill)
        if found is None:
            return torch.zeros_like(eligible)
        tokens, count = (values[:, 0] for values in found)  # the latest
        room = torch.clamp(state.max_new_tokens - state.generated, max=layout.window_size)
        count = torch.minimum(count, room - 1).masked_fill(~eligible, 0)
        size, first = self.slots(layout), int(not prefill)
        placed = layout.slots[:, :size] < count[:, None]
        drafts = state.window[:, first : first + size]  # views: the drafts land in the state
        drafts.copy_(torch.where(placed, tokens[:, :size], drafts))
        state.fill_step[:, first : first + size].masked_fill_(placed, record.steps)
        if draft_probs is not None:
            probs = draft_probs[:, first : first + size]
            one_hot = torch.zeros_like(probs).scatter_(-1, tokens[:, :size, None], 1.0)
            probs.copy_(torch.where(placed[..., None], one_hot, probs))
        grown = torch.maximum(state.length, torch.minimum(count + 1 + first, room))
        state.length = torch.where(count > 0, grown, state.length)
        return count > 0

    def slots(self, layout: WindowLayout) -> int:
        """The most drafts a row gets at once (the certain token and one mask slot take the rest of a window)."""
        return min(self.tokens, layout.window_size - 1)


def _suffixes(ids: torch.Tensor, ngram: int) -> torch.Tensor:
    """(rows, columns, ngram) the `ngram` tokens ending at each column (-1 before the first)."""
    return torch.nn.functional.pad(ids, (ngram - 1, 0), value=-1).unfold(1, ngram, 1)


def _occurrences(hit: torch.Tensor, columns: torch.Tensor, matches: int) -> torch.Tensor:
    """(rows, matches) the columns where `hit` (rows, columns) holds: the latest, the earliest, then the next latest
    (-1 past a row's hits; for the earliest also where the latest ones hold it already)."""
    later = max(matches - 1, 1)
    latest = torch.where(hit, columns, -1).topk(min(later, columns.numel()), 1).values
    if latest.shape[1] < later:  # (fewer columns than matches: before the first forward of a short prompt)
        latest = torch.nn.functional.pad(latest, (0, later - latest.shape[1]), value=-1)
    earliest = torch.where(hit, columns, columns.numel()).amin(1, keepdim=True)
    earliest = earliest.masked_fill((earliest >= columns.numel()) | (earliest >= latest[:, -1:]), -1)
    return torch.cat([latest[:, :1], earliest, latest[:, 1:]], 1)[:, :matches]


def _match_lengths(suffixes: torch.Tensor, last: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """(rows, columns) how many of the tokens ending at each column (`suffixes`: `_suffixes` of rows or 1 text)
    equal the last ones of `last` (rows, 1, ngram), counted back from it, at most `real` (rows,): every n-gram size
    in one pass."""
    equal = (suffixes == last).flip(-1)
    return torch.minimum(equal.int().cumprod(-1).sum(-1), real[:, None])
