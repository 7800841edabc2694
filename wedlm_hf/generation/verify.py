"""What lossless mode verifies drafts against: transformers' own next-token choice at every verified position.

Each verified position (the certain token, each leading draft) gets the call's logits processors (warpers
included) with exactly the input ids `generate()` would hand them there: the row's padded prompt, its committed
tokens and the drafts before that position, so processors that read the prefix (n-gram bans, multi-token bad
words) or its length (`input_ids.shape[-1]`: min length, forced BOS/EOS, exponential decay) act as in AR decoding.
The positions of one step differ in length, so they run in one stacked call per distinct length.

Greedy: a draft passes while it is the argmax of the processed scores before it. Sampling (speculative sampling,
Leviathan et al. 2023; Chen et al. 2023): a draft x drawn from q passes with probability min(1, p(x)/q(x)); the
first failure is replaced by a sample of normalised max(0, p - q), and when every draft passes one more token comes
from p, so each committed token is distributed as transformers' sampled `generate()` draws it. Random draws use
torch's global generator, as transformers' sampling does (`torch.manual_seed` makes a call reproducible), or,
for rows with their own sampling (`sampling.py`), numbers keyed on the row alone.

Processors that read the prefix or its length (n-gram bans, min length...) run in one stacked call per distinct
length, one host read a step; the row-wise ones `sampling.py` applies densely (penalties, temperature, top-k/p,
min-p) need no grouping.
"""

from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList

from .processors import for_rows
from .record import OutputRecord
from .draws import draw
from .sampling import ACCEPT, NEXT
from .window import WindowState


@dataclass
class Verifier:
    logits_processor: LogitsProcessorList
    record: OutputRecord
    """Holds each row's padded prompt and committed tokens: the prefix the processors see."""
    do_sample: bool

    @property
    def needs_scores(self) -> bool:
        """Whether verification needs the positions' full scores (else an argmax of the raw logits decides)."""
        return bool(self.logits_processor) or self.do_sample or self.record.sampling is not None

    def scores(
        self, state: WindowState, logits: torch.Tensor, count: torch.Tensor, drafts: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(rows, positions, vocab) float32 scores: position j of row r through the processors with the prefix
        committed(r) + drafts[r, :j], for j < count[r]; the other positions stay raw. `drafts` default to the
        window's slots after the certain token (slot 0, committed already)."""
        scores = logits.to(dtype=torch.float32, copy=True)
        record, positions, sampling = self.record, logits.shape[1], self.record.sampling
        drafts = state.window[:, 1:positions] if drafts is None else drafts
        if self.logits_processor:
            scores = self._grouped(state, scores, count, drafts)
        if sampling is None:
            return scores
        seen = sampling.seen(record, state, scores.shape[-1], drafts)
        return sampling.processed(scores, state.rows, seen)

    def greedy_rows(self, state: WindowState) -> torch.Tensor | None:
        """Which running rows decode greedily (per row where rows have their own sampling), or None for none."""
        sampling = self.record.sampling
        if sampling is not None and sampling.of_requests:
            return ~sampling.sample[state.rows]
        return None if self.do_sample else torch.ones_like(state.done)

    def prefill(
        self, state: WindowState, logits: torch.Tensor, drafts: torch.Tensor, count: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The first forward's check, before any certain token: `logits` (rows, k + 1, vocab) are the prompt's last
        token's and those of the k `drafts` (rows, k) fed after it (prompt lookup's, proposals of probability 1:
        q is one-hot), `count` of them per row. Returns how many pass, the token after them and the scores."""
        scores = self.scores(state, logits, count + 1, drafts)
        if drafts.shape[1] == 0:
            return torch.zeros_like(count), self.next_tokens(scores, state)[:, 0], scores
        one_hot = torch.zeros_like(scores[:, :-1]).scatter_(-1, drafts[..., None], 1.0) if self.do_sample else None
        accepted, token = self.verify(scores, drafts, count, one_hot, state)
        return accepted, token, scores

    def _grouped(
        self, state: WindowState, scores: torch.Tensor, count: torch.Tensor, drafts: torch.Tensor
    ) -> torch.Tensor:
        """The call's processors at each position, its exact prefix as input ids: one stacked call per length."""
        record, positions, device = self.record, scores.shape[1], scores.device
        committed = record.prompt_length + state.generated
        steps = torch.arange(positions, device=device)
        longest = int(committed.max()) + positions - 1
        columns = torch.arange(longest, device=device).clamp(max=record.sequences.shape[1] - 1)
        prefixes = record.sequences[state.rows[:, None], columns[None]]
        if positions > 1:
            prefixes.scatter_(1, committed[:, None] + steps[None, :-1], drafts)
        rows, position = (steps[None] < count[:, None]).nonzero(as_tuple=True)
        lengths = committed[rows] + position
        for length in lengths.unique().tolist():
            at = lengths == length
            picked_rows, picked = rows[at], position[at]
            processors = for_rows(self.logits_processor, state.rows[picked_rows])
            scores[picked_rows, picked] = processors(prefixes[picked_rows, :length], scores[picked_rows, picked])
        return scores

    def next_tokens(self, scores: torch.Tensor, state: WindowState) -> torch.Tensor:
        """(rows, positions): the token transformers would choose after each position (argmax, or a sample)."""
        sampling = self.record.sampling
        if sampling is not None:
            return sampling.choose(scores, state.rows, self.record.forward_numbers(state), NEXT)[0]
        if not self.do_sample:
            return scores.argmax(-1)
        probs = torch.softmax(scores, dim=-1)
        return torch.multinomial(probs.flatten(0, -2), 1).view(probs.shape[:-1])

    def verify(
        self, scores: torch.Tensor, drafts: torch.Tensor, draft_count: torch.Tensor, draft_probs: torch.Tensor | None,
        state: WindowState,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row, how many leading drafts pass and the token after them.

        `scores` (rows, k + 1, vocab) are the processed scores at the certain token and each of the k `drafts`
        (rows, k) slots; `draft_count` (rows,) how many of them are drafts; `draft_probs` (rows, k, vocab) the
        distributions q the drafts were sampled from (sampling only)."""
        in_draft = torch.arange(drafts.shape[1], device=drafts.device)[None] < draft_count[:, None]
        sampling = self.record.sampling
        if not self.do_sample or (sampling is not None and not sampling.any_sample):
            return greedy_accept(scores.argmax(-1), drafts, in_draft)
        if sampling is None:
            uniform = torch.rand((*drafts.shape,), device=drafts.device)
            accepted, token = _speculative(scores, drafts, draft_count, draft_probs, in_draft, uniform, None)
            return accepted, token
        rows, forward = state.rows, self.record.forward_numbers(state)
        uniform = sampling.uniforms(rows, forward, ACCEPT, drafts.shape[1])
        accepted, token = _speculative(
            scores, drafts, draft_count, draft_probs, in_draft, uniform, sampling.uniforms(rows, forward, NEXT, 1)
        )
        greedy_accepted, greedy_token = greedy_accept(scores.argmax(-1), drafts, in_draft)
        sample = sampling.sample[rows]
        return torch.where(sample, accepted, greedy_accepted), torch.where(sample, token, greedy_token)


def _speculative(
    scores: torch.Tensor, drafts: torch.Tensor, draft_count: torch.Tensor, draft_probs: torch.Tensor,
    in_draft: torch.Tensor, uniform: torch.Tensor, final: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling of every row: drafts pass while `uniform` * q < p, then one token from p (or from
    the residual after a rejection), drawn with `final` (n, 1) uniforms, else torch's global generator."""
    accepted, target = speculative_target(torch.softmax(scores, dim=-1), drafts, draft_count, draft_probs, in_draft,
                                          uniform)
    if final is None:
        return accepted, torch.multinomial(target, 1).squeeze(1)
    return accepted, draw(target[:, None], final)[:, 0]


def speculative_target(
    probs: torch.Tensor, drafts: torch.Tensor, draft_count: torch.Tensor, draft_probs: torch.Tensor,
    in_draft: torch.Tensor, uniform: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """How many drafts pass (while `uniform` * q < p, `probs` p (rows, k + 1, vocab)), and the (rows, vocab)
    unnormalised distribution the next token is drawn from: p after the last passing draft, or, after a
    rejection, p less the q the rejected draft was drawn from (what that draw did not cover)."""
    p_draft = probs[:, :-1].gather(-1, drafts[..., None]).squeeze(-1)
    q_draft = draft_probs.gather(-1, drafts[..., None]).squeeze(-1)
    passes = (uniform * q_draft < p_draft) & in_draft
    accepted = passes.int().cumprod(1).sum(1)
    target = _at(probs, accepted)
    if drafts.shape[1]:
        residual = (target - _at(draft_probs, accepted.clamp(max=drafts.shape[1] - 1))).clamp(min=0)
        rejected = (accepted < draft_count) & (residual.sum(-1) > 0)
        target = torch.where(rejected[:, None], residual, target)
    return accepted, target


def greedy_accept(
    chosen: torch.Tensor, drafts: torch.Tensor, in_draft: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafts accepted while each equals the token `chosen` (rows, k + 1) after the position before it, and the
    token chosen after the last accepted one."""
    accepted = ((drafts == chosen[:, :-1]) & in_draft).int().cumprod(1).sum(1)
    return accepted, chosen.gather(1, accepted[:, None]).squeeze(1)


def _at(values: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """(rows, vocab): each row's `values` (rows, positions, vocab) at its `position`."""
    return values.gather(1, position[:, None, None].expand(-1, 1, values.shape[-1])).squeeze(1)
