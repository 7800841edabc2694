"""A second candidate continuation verified in the same forward as the window's drafts: a tree of two branches.

Lossless mode's window is one chain (the certain token, then its drafts), so where prompt lookup and the mask
predictions disagree only one of them could be tried. Here the lookup tokens from the first disagreement on are
fed as a *branch*: extra columns before the window, each at its logical position, attending to the committed
prefix, to the window slots before the divergence (its ancestors) and to the branch tokens before it, through a
4D attention mask (`tree_mask`); no window slot sees the branch, so the window's logits are what they are without
it. Verification walks the window's chain and, at the node where the branch leaves it, tries the branch's first
token as a second candidate (`verify`): greedy, where it is the argmax there; sampling, by recursive rejection
(SpecInfer, Miao et al. 2024): once the window's draft at that node is rejected (or the chain ended there), the
branch token, proposed with probability 1, passes with the remaining distribution's probability of it, and if it
fails too the next token comes from that distribution without it, so every committed token keeps the model's
distribution. A row that takes the branch keeps the K/V of its ancestors and accepted branch tokens, put in order by
the backend's commit (`Kept.columns`); its window's mask predictions saw the other chain, so it drafts anew at
the next forward.

A tree needs a 4D mask (SDPA or eager attention, not FlashAttention), forwards of free width (not
`wedlm_static`) and processed scores that do not read the prefix (no logits processors, penalties or kept
scores): elsewhere prompt lookup drafts the window's own chain (`lossless.py`).
"""

from dataclasses import dataclass

import torch

from .draws import draw
from .sampling import ACCEPT, BRANCH, NEXT
from .verify import Verifier, greedy_accept, speculative_target
from .window import PerRow, StepPlan, WindowState


@dataclass
class Branch(PerRow):
    """Per running row, the branch the next forward verifies beside the window."""

    tokens: torch.Tensor
    """(rows, size) its tokens, for window slots `depth`, `depth + 1`, ..."""
    depth: torch.Tensor
    """The window slot its first token stands at: slots 0 .. depth - 1 are its ancestors."""
    count: torch.Tensor
    """How many tokens it has (0: none)."""

    @classmethod
    def empty(cls, like: torch.Tensor, size: int) -> "Branch":
        return cls(torch.zeros((like.shape[0], size), dtype=torch.long, device=like.device),
                   torch.ones_like(like), torch.zeros_like(like))

    def propose(
        self, window: torch.Tensor, mask_id: int, tokens: torch.Tensor, count: torch.Tensor, room: torch.Tensor,
    ) -> None:
        """Branch off a continuation `tokens` (rows, n) of `count` tokens for slots 1, 2, ...: from the first one
        the window does not hold already, within `room` (rows,) slots (the window size, the row's budget)."""
        size = self.tokens.shape[1]  # (at most `window_size - 1`: a branch's slots are within the window size)
        tokens = tokens[:, :size]
        n, held = tokens.shape[1], window[:, 1 : 1 + size]
        same = (held == tokens) & (held != mask_id) & (torch.arange(n, device=tokens.device) < count[:, None])
        shared = same.int().cumprod(1).sum(1)
        self.depth = shared + 1
        self.count = torch.minimum(count - shared, room - self.depth).clamp(min=0, max=size)
        offsets = (shared[:, None] + torch.arange(size, device=tokens.device)).clamp(max=n - 1)
        self.tokens = tokens.gather(1, offsets)

    def plan_fields(self) -> dict[str, torch.Tensor]:
        """The branch as `StepPlan` carries it to the forward."""
        return {"branch_tokens": self.tokens, "branch_depth": self.depth, "branch_count": self.count}

    def kept_columns(self, took: torch.Tensor, branch_width: int, window_size: int) -> torch.Tensor:
        """(rows, window_size) the fed column of each window slot's K/V after verification: the window's columns
        follow the branch's `branch_width`; a row that `took` its branch has its tokens from slot `depth` on."""
        slots = torch.arange(window_size, device=took.device)[None]
        from_branch = took[:, None] & (slots >= self.depth[:, None])
        return torch.where(from_branch, slots - self.depth[:, None], slots + branch_width)

    def write(self, window: torch.Tensor, fill_step: torch.Tensor, took: torch.Tensor, accepted: torch.Tensor,
              step: int) -> None:
        """The accepted branch tokens (`accepted` (rows,) of them, in rows that `took` the branch) go into their
        window slots, in place, so the record commits them as window slots."""
        slots = torch.arange(window.shape[1], device=window.device)[None]
        offset = slots - self.depth[:, None]
        placed = took[:, None] & (offset >= 0) & (offset < accepted[:, None])
        window.copy_(torch.where(placed, self.tokens.gather(1, offset.clamp(0, self.tokens.shape[1] - 1)), window))
        fill_step.masked_fill_(placed, step)


def tree_mask(depth: torch.Tensor, branch_width: int, fed: int) -> torch.Tensor:
    """(rows, branch_width + fed, branch_width + fed) which fed column each fed column attends to: window columns
    causally among themselves, branch columns to the branch columns before them and to the window columns before
    `depth` (the window's leading slots are its first fed columns, in slot order)."""
    columns = torch.arange(branch_width + fed, device=depth.device)
    query, key = columns[:, None], columns[None]
    causal = key <= query
    same_part = (query < branch_width) == (key < branch_width)
    ancestor = (query < branch_width) & (key >= branch_width) & (key - branch_width < depth[:, None, None])
    return (causal & same_part) | ancestor


def branch_inputs(
    plan: StepPlan, state: WindowState, width: int, fed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A tree forward's branch columns (`width`, before the window's `fed`): their ids, logical positions and
    liveness (rows, width), and the (rows, width + fed, width + fed) mask among all fed columns."""
    offsets = torch.arange(width, device=plan.length.device)
    positions = (state.first_position + plan.start + plan.branch_depth)[:, None] + offsets
    live = offsets < plan.branch_count[:, None]
    return plan.branch_tokens[:, :width], positions, live, tree_mask(plan.branch_depth, width, fed)


def verify(
    verifier: Verifier, state: WindowState, scores: torch.Tensor | None, chosen: torch.Tensor | None,
    drafts: torch.Tensor, draft_count: torch.Tensor, draft_probs: torch.Tensor | None, branch: Branch,
    branch_logits: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: the window's drafts that pass, whether the row takes its branch, the tokens it commits after its
    certain token (along the chain it takes), and the token after them. The window's positions come as processed
    `scores` (rows, k + 1, vocab), or, greedy without processing, as their argmax `chosen` (rows, k + 1)."""
    width = branch_logits.shape[1]
    in_draft = torch.arange(drafts.shape[1], device=drafts.device)[None] < draft_count[:, None]
    in_branch = torch.arange(width, device=drafts.device)[None] < branch.count[:, None]
    tokens = branch.tokens[:, :width]
    sampling = verifier.record.sampling
    branch_scores = branch_logits.float()
    if sampling is not None:  # its scores read no prefix here (no penalties in a tree)
        branch_scores = sampling.processed(branch_scores, state.rows, None)
    if chosen is None:
        chosen = scores.argmax(-1)
    accepted, after = greedy_accept(chosen, drafts, in_draft)
    node = chosen.gather(1, (branch.depth - 1).clamp(max=chosen.shape[1] - 1)[:, None]).squeeze(1)
    took = (branch.count > 0) & (accepted == branch.depth - 1) & (node == tokens[:, 0])
    branch_chosen = branch_scores.argmax(-1)
    passes = (tokens[:, 1:] == branch_chosen[:, :-1]) & in_branch[:, 1:]
    taken = 1 + passes.int().cumprod(1).sum(1)
    after = torch.where(took, branch_chosen.gather(1, (taken - 1)[:, None]).squeeze(1), after)
    if sampling is None or not sampling.any_sample:
        return accepted, took, torch.where(took, branch.depth - 1 + taken, accepted), after
    rows, forward = state.rows, verifier.record.forward_numbers(state)
    probs = scores.softmax(-1)
    uniform = sampling.uniforms(rows, forward, ACCEPT, drafts.shape[1])
    sampled, target = speculative_target(probs, drafts, draft_count, draft_probs, in_draft, uniform)
    sampled_took, sampled_taken, target = _sampled_branch(
        target, sampled, branch, tokens, in_branch, branch_scores.softmax(-1),
        sampling.uniforms(rows, forward, BRANCH, width),
    )
    sampled_after = draw(target[:, None], sampling.uniforms(rows, forward, NEXT, 1))[:, 0]
    sample = sampling.sample[rows]
    accepted, took = torch.where(sample, sampled, accepted), torch.where(sample, sampled_took, took)
    taken = torch.where(sample, sampled_taken, taken)
    after = torch.where(sample, sampled_after, after)
    return accepted, took, torch.where(took, branch.depth - 1 + taken, accepted), after


def _sampled_branch(
    target: torch.Tensor, accepted: torch.Tensor, branch: Branch, tokens: torch.Tensor, in_branch: torch.Tensor,
    branch_probs: torch.Tensor, uniform: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Recursive rejection at the branch's node: whether each row takes its branch, how many branch tokens pass,
    and the (rows, vocab) distribution its next token is drawn from. `target` is what the window's chain would
    draw from after its `accepted` drafts; a branch token is a proposal of probability 1, so it passes with the
    probability the distribution at its node gives it, and a rejected one is removed from that distribution."""
    at_node = (branch.count > 0) & (accepted == branch.depth - 1)
    first = target.gather(1, tokens[:, :1]).squeeze(1) / target.sum(-1)
    took = at_node & (uniform[:, 0] < first)
    p_next = branch_probs[:, :-1].gather(-1, tokens[:, 1:, None]).squeeze(-1)
    passes = (uniform[:, 1:] < p_next) & in_branch[:, 1:]
    taken = 1 + passes.int().cumprod(1).sum(1)
    last = branch_probs.gather(1, (taken - 1)[:, None, None].expand(-1, 1, branch_probs.shape[-1])).squeeze(1)
    rejected = tokens.gather(1, taken.clamp(max=tokens.shape[1] - 1)[:, None])
    last = torch.where((taken < branch.count)[:, None], last.scatter(1, rejected, 0.0), last)
    without_first = target.scatter(1, tokens[:, :1], 0.0)
    target = torch.where((at_node & ~took & (without_first.sum(-1) > 0))[:, None], without_first, target)
    return took, taken, torch.where(took[:, None], last, target)
