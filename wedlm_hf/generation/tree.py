"""More candidate continuations verified in the same forward as the window's drafts: a small tree.

Lossless mode's window is one chain (the certain token, then its drafts), so where prompt lookup and the mask
predictions disagree, or two earlier occurrences of the context continue differently, only one guess could be
tried. Here each lookup continuation (the latest and the earliest match, more with `wedlm_prompt_lookup_matches`,
`lookup.py`) is fed from its first disagreement with the window on as a *branch*: extra columns before the window,
each at its logical position, attending to the committed prefix, to the window slots before the divergence (its
ancestors) and to its own tokens before it, through a 4D attention mask (`tree_mask`); no window slot sees a
branch, so the window's logits are what they are without them. Verification walks the window's chain and, at the
node where a branch leaves it, tries the branch's first token as a further candidate (`verify`): greedy, where it
is the argmax there; sampling, by recursive rejection (SpecInfer, Miao et al. 2024): once the window's draft at
that node is rejected (or the chain ended there), each branch token there in turn, proposed with probability 1,
passes with the remaining distribution's probability of it, and leaves that distribution without it if it fails, so
every committed token keeps the model's distribution. A row that takes a branch keeps the K/V of its ancestors and
accepted branch tokens, put in order by the backend's commit (`Kept.columns`); where the window's drafts before it
were rejected, its mask predictions saw them, so it drafts anew at the next forward.

The first branch (the latest match) is fed whole, as transformers' prompt lookup feeds its one match. On a CPU,
where every fed column is compute, a later one is fed only as far as its rank's branches have been passing
(`Branch.adapt`): such second opinions pass far less often than the first, yet fed whole each costs as many
columns.

A tree needs a 4D mask (SDPA or eager attention, not FlashAttention), forwards of free width (not
`wedlm_static`) and processed scores that do not read the prefix (no logits processors, penalties or kept
scores): elsewhere prompt lookup drafts the window's own chain (`lookup_drafts.py`).
"""

from dataclasses import dataclass

import torch

from .draws import draw
from .fill import gather_columns
from .sampling import ACCEPT, BRANCH, NEXT
from .verify import Verifier, greedy_accept, speculative_target
from .window import PerRow, StepPlan, WindowState


SHORTEST_SECOND_BRANCH = {"cpu": 3}
"""Per device type, the fewest tokens a branch after the first is fed once its rank's branches fail: on a CPU each
fed column is compute (docs/benchmarks.md, "Later branches fed as far as they pass"). Elsewhere every branch is fed
whole: a decoding forward there is bound by reading the weights, not by its columns (declared, not measured)."""


@dataclass
class Branch(PerRow):
    """Per running row, the branches the next forward verifies beside the window (second dimension: the branch)."""

    tokens: torch.Tensor
    """(rows, branches, size) their tokens, for window slots `depth`, `depth + 1`, ..."""
    depth: torch.Tensor
    """(rows, branches) the window slot a branch's first token stands at: slots 0 .. depth - 1 are its ancestors."""
    count: torch.Tensor
    """(rows, branches) how many tokens a branch has (0: none)."""
    limit: torch.Tensor
    """(rows, branches) the most tokens each branch is fed: the first (the latest match, as transformers' prompt
    lookup drafts its match) always `size`; a later one as far as its rank's branches have been passing (`adapt`)."""
    shortest: int
    """The fewest tokens `adapt` leaves a later branch (`SHORTEST_SECOND_BRANCH`; `size` where it is not cut)."""

    @classmethod
    def empty(cls, like: torch.Tensor, branches: int, size: int) -> "Branch":
        rows, shortest = like.shape[0], min(SHORTEST_SECOND_BRANCH.get(like.device.type, size), size)
        return cls(like.new_zeros((rows, branches, size)), like.new_ones((rows, branches)),
                   like.new_zeros((rows, branches)), like.new_full((rows, branches), size), shortest)

    def propose(
        self, window: torch.Tensor, mask_id: int, tokens: torch.Tensor, count: torch.Tensor, room: torch.Tensor,
    ) -> None:
        """Branch off continuations `tokens` (rows, branches, n) of `count` (rows, branches) tokens for slots 1, 2,
        ...: each from its first token the window does not hold already, within `room` (rows,) slots (the window
        size, the row's budget); one that an earlier one holds whole (same depth, its tokens a prefix of the
        earlier one's) is dropped: it would never commit more."""
        size = self.tokens.shape[-1]  # (at most `window_size - 1`: a branch's slots are within the window size)
        tokens = tokens[..., :size]
        n, held = tokens.shape[-1], window[:, None, 1 : 1 + size]
        same = (held == tokens) & (held != mask_id) & (torch.arange(n, device=tokens.device) < count[..., None])
        shared = same.int().cumprod(-1).sum(-1)
        depth, offsets = shared + 1, (shared[..., None] + torch.arange(size, device=tokens.device)).clamp(max=n - 1)
        tokens = tokens.gather(-1, offsets)
        count = torch.minimum(torch.minimum(count - shared, room[:, None] - depth), self.limit).clamp(min=0)
        past = torch.arange(size, device=tokens.device) >= count[..., None]  # (rows, branches, size)
        for later in range(1, tokens.shape[1]):  # (the branches, a few: not the rows)
            one = slice(later, later + 1)
            held = ((tokens[:, one] == tokens[:, :later]) | past[:, one]).all(-1) & (depth[:, one] == depth[:, :later])
            count[:, later] *= ~(held & (count[:, one] <= count[:, :later])).any(1)
        self.tokens, self.depth, self.count = tokens, depth, count

    def adapt(self, best: torch.Tensor, took: torch.Tensor, passed: torch.Tensor) -> None:
        """The later branches' limits after a verification in which rows that `took` a branch took `best`, of whose
        tokens `passed` were committed: as the draft limit follows acceptance (`draft_schedule.py`), a branch that
        passed whole doubles its rank's limit plus one, one that failed sets it to twice its tokens that passed (at
        least `shortest`); a rank that fed no branch keeps its limit."""
        if self.shortest >= self.tokens.shape[-1]:
            return
        later = torch.arange(1, self.count.shape[1], device=best.device)
        passed = passed[:, None] * (took[:, None] & (later == best[:, None]))
        limit, count = self.limit[:, 1:], self.count[:, 1:]
        limit = torch.where(passed >= count, 2 * limit + 1, 2 * passed).clamp(self.shortest, self.tokens.shape[-1])
        self.limit[:, 1:] = torch.where(count > 0, limit, self.limit[:, 1:])

    def fed_columns(self, width: int) -> torch.Tensor:
        """(rows, branches, size) the fed column of each branch token: a row's branches are fed one after another
        (`branch_inputs`), in `width` columns in all (past a branch's count: a column of no meaning)."""
        start = _starts(self.count)
        return (start[..., None] + torch.arange(self.tokens.shape[-1], device=start.device)).clamp(max=width - 1)

    def kept_columns(self, best: torch.Tensor, took: torch.Tensor, width: int, window_size: int) -> torch.Tensor:
        """(rows, window_size) the fed column of each window slot's K/V after verification: the window's columns
        follow the branches' `width`; a row that `took` its branch `best` has that branch's from slot `depth` on."""
        slots = torch.arange(window_size, device=took.device)[None]
        depth = self.depth.gather(1, best[:, None])
        start = _starts(self.count).gather(1, best[:, None])
        from_branch = took[:, None] & (slots >= depth)
        return torch.where(from_branch, start + slots - depth, slots + width)

    def write(self, window: torch.Tensor, fill_step: torch.Tensor, best: torch.Tensor, took: torch.Tensor,
              accepted: torch.Tensor, step: int) -> None:
        """The accepted tokens of branch `best` (`accepted` (rows,) of them, in rows that `took` it) go into their
        window slots, in place, so the record commits them as window slots."""
        slots = torch.arange(window.shape[1], device=window.device)[None]
        offset = slots - self.depth.gather(1, best[:, None])
        placed = took[:, None] & (offset >= 0) & (offset < accepted[:, None])
        tokens = _of(self.tokens, best)
        window.copy_(torch.where(placed, tokens.gather(1, offset.clamp(0, tokens.shape[1] - 1)), window))
        fill_step.masked_fill_(placed, step)


def plan_fields(branch: Branch | None) -> dict[str, torch.Tensor]:
    """`branch` as `StepPlan` carries it to the forward (nothing without a tree)."""
    if branch is None:
        return {}
    return {"branch_tokens": branch.tokens, "branch_depth": branch.depth, "branch_count": branch.count}


def tree_mask(part: torch.Tensor, depth: torch.Tensor, fed: int) -> torch.Tensor:
    """(rows, width + fed, width + fed) which fed column each fed column attends to, for `width` branch columns fed
    first, `part` (rows, width) the branch each holds (-1: none) and `depth` (rows, width) that branch's depth:
    window columns causally among themselves, a branch's columns to its own columns before them and to the window
    columns before its depth (the window's leading slots are its first fed columns, in slot order)."""
    rows, width = part.shape
    part = torch.cat([part, part.new_full((rows, fed), -2)], 1)  # (-2: the window's)
    depth = torch.cat([depth, depth.new_zeros((rows, fed))], 1)
    columns = torch.arange(width + fed, device=part.device)
    query, key = columns[:, None], columns[None]
    ancestor = (part >= 0)[..., None] & (key >= width) & (key - width < depth[..., None])
    return ((key <= query) & (part[..., None] == part[:, None])) | ancestor


def branch_inputs(
    plan: StepPlan, state: WindowState, width: int, fed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A tree forward's branch columns (`width`, before the window's `fed`): each row's branches one after
    another, their ids, logical positions and liveness (rows, width), and the mask among all fed columns."""
    count, tokens = plan.branch_count, plan.branch_tokens
    starts = _starts(count)
    ends, columns = starts + count, torch.arange(width, device=count.device)
    part = (columns[None, :, None] >= ends[:, None, :]).sum(-1)  # (rows, width): the branch of each column
    live = part < count.shape[1]
    part = part.clamp(max=count.shape[1] - 1)
    offset = (columns - starts.gather(1, part)).clamp(0, tokens.shape[-1] - 1)  # within the branch
    depth = plan.branch_depth.gather(1, part)
    ids = tokens.flatten(1).gather(1, part * tokens.shape[-1] + offset)
    positions = (state.first_position + plan.start)[:, None] + depth + offset
    return ids, positions, live, tree_mask(part.masked_fill(~live, -1), depth, fed)


def verify(
    verifier: Verifier, state: WindowState, scores: torch.Tensor | None, chosen: torch.Tensor | None,
    drafts: torch.Tensor, draft_count: torch.Tensor, draft_probs: torch.Tensor | None, branch: Branch,
    branch_logits: torch.Tensor, window_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`verified`, then the taken branch's tokens written into the window (`Branch.write`): per row, the window's
    drafts that pass, whether it took a branch, the tokens it commits after its certain token, the token after
    them, and the fed columns of the K/V it keeps (`Branch.kept_columns`)."""
    accepted, took, best, committed, after = verified(
        verifier, state, scores, chosen, drafts, draft_count, draft_probs, branch, branch_logits
    )
    from_branch = committed + 1 - branch.depth.gather(1, best[:, None]).squeeze(1)
    branch.adapt(best, took, from_branch)
    branch.write(state.window, state.fill_step, best, took, from_branch, verifier.record.steps)
    columns = branch.kept_columns(best, took, branch_logits.shape[1], window_size)
    return accepted, took, committed, after, columns


def verified(
    verifier: Verifier, state: WindowState, scores: torch.Tensor | None, chosen: torch.Tensor | None,
    drafts: torch.Tensor, draft_count: torch.Tensor, draft_probs: torch.Tensor | None, branch: Branch,
    branch_logits: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: the window's drafts that pass, whether the row takes a branch and which, the tokens it commits
    after its certain token (along the chain it takes), and the token after them. The window's positions come as
    processed `scores` (rows, k + 1, vocab), or, greedy without processing, as their argmax `chosen` (rows, k +
    1); `branch_logits` (rows, branch columns, vocab), the branches fed one after another."""
    rows, branches = branch.count.shape
    size = min(branch.tokens.shape[-1], branch_logits.shape[1])
    in_draft = torch.arange(drafts.shape[1], device=drafts.device)[None] < draft_count[:, None]
    in_branch = torch.arange(size, device=drafts.device) < branch.count[..., None]  # (rows, branches, size)
    tokens, fed_columns = branch.tokens[..., :size], branch.fed_columns(branch_logits.shape[1])[..., :size]
    sampling = verifier.record.sampling
    if sampling is None or not sampling.any_sample:  # (greedy: the argmax of each fed column is enough)
        branch_chosen = branch_logits.argmax(-1).gather(1, fed_columns.flatten(1)).view(rows, branches, size)
    else:  # its scores read no prefix here (no penalties in a tree)
        branch_logits = gather_columns(branch_logits, fed_columns.flatten(1)).float()
        branch_scores = sampling.processed(branch_logits, state.rows, None)
        branch_scores = branch_scores.view(rows, branches, size, -1)
        branch_chosen = branch_scores.argmax(-1)
    if chosen is None:
        chosen = scores.argmax(-1)
    accepted, after = greedy_accept(chosen, drafts, in_draft)
    node = chosen.gather(1, (branch.depth - 1).clamp(max=chosen.shape[1] - 1))  # (rows, branches)
    at_node = (branch.count > 0) & (accepted[:, None] == branch.depth - 1)
    passes = (tokens[..., 1:] == branch_chosen[..., :-1]) & in_branch[..., 1:]
    taken = 1 + passes.int().cumprod(-1).sum(-1)  # (rows, branches): tokens passing once its first does
    reach = at_node & (node == tokens[..., 0])
    best, took = torch.where(reach, taken, 0).argmax(1), reach.any(1)
    taken = taken.gather(1, best[:, None]).squeeze(1)
    after = torch.where(took, _of(branch_chosen, best).gather(1, (taken - 1)[:, None]).squeeze(1), after)
    if sampling is not None and sampling.any_sample:
        forward = verifier.record.forward_numbers(state)
        uniform = sampling.uniforms(state.rows, forward, ACCEPT, drafts.shape[1])
        drawn = speculative_target(scores.softmax(-1), drafts, draft_count, draft_probs, in_draft, uniform)
        index = (torch.arange(branches, device=tokens.device)[:, None] * branch.tokens.shape[-1]  # (a row's own)
                 + torch.arange(size, device=tokens.device)).flatten()
        uniform = sampling.uniforms(state.rows, forward, BRANCH, index.numel(), index).view(rows, branches, size)
        *drawn, target = _sampled_branches(*drawn, branch, tokens, in_branch, branch_scores.softmax(-1), uniform)
        drawn.append(draw(target[:, None], sampling.uniforms(state.rows, forward, NEXT, 1))[:, 0])
        sample = sampling.sample[state.rows]
        accepted, took, best, taken, after = (
            torch.where(sample, mine, greedy) for mine, greedy in zip(drawn, (accepted, took, best, taken, after))
        )
    committed = torch.where(took, branch.depth.gather(1, best[:, None]).squeeze(1) - 1 + taken, accepted)
    return accepted, took, best, committed, after


def _sampled_branches(
    accepted: torch.Tensor, target: torch.Tensor, branch: Branch, tokens: torch.Tensor, in_branch: torch.Tensor,
    branch_probs: torch.Tensor, uniform: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Recursive rejection at the branches' node: the window's drafts that pass (`accepted`, as given), whether
    each row takes a branch, which, how many of its tokens pass, and the (rows, vocab) distribution its next token
    is drawn from. `target` is what the
    window's chain would draw from after its `accepted` drafts; each branch token at that node, in branch order,
    is a proposal of probability 1: it passes with the probability the remaining distribution gives it, and a
    rejected one is removed from that distribution (so a repeated one never passes)."""
    at_node = (branch.count > 0) & (accepted[:, None] == branch.depth - 1)
    took, best = torch.zeros_like(accepted, dtype=torch.bool), torch.zeros_like(accepted)
    for index in range(tokens.shape[1]):  # (the branches, a few: not the rows)
        first = tokens[:, index, :1]
        candidate = at_node[:, index] & ~took
        passes = candidate & (uniform[:, index, 0] * target.sum(-1) < target.gather(1, first).squeeze(1))
        took, best = took | passes, torch.where(passes, index, best)
        without = target.scatter(1, first, 0.0)
        target = torch.where((candidate & ~passes & (without.sum(-1) > 0))[:, None], without, target)
    p_next = branch_probs[..., :-1, :].gather(-1, tokens[..., 1:, None]).squeeze(-1)
    passes = (uniform[..., 1:] < p_next) & in_branch[..., 1:]
    taken = 1 + passes.int().cumprod(-1).sum(-1)  # (rows, branches)
    taken_best = taken.gather(1, best[:, None]).squeeze(1)
    probs = _of(branch_probs, best)  # (rows, width, vocab)
    last = probs.gather(1, (taken_best - 1)[:, None, None].expand(-1, 1, probs.shape[-1])).squeeze(1)
    rejected = _of(tokens, best).gather(1, taken_best.clamp(max=tokens.shape[-1] - 1)[:, None])
    count = branch.count.gather(1, best[:, None]).squeeze(1)
    last = torch.where((taken_best < count)[:, None], last.scatter(1, rejected, 0.0), last)
    return accepted, took, best, taken_best, torch.where(took[:, None], last, target)


def _starts(count: torch.Tensor) -> torch.Tensor:
    """(rows, branches) each branch's first column among the branch columns: a row's branches are fed one after
    another, `count` (rows, branches) tokens each."""
    return count.cumsum(1) - count


def _of(values: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
    """Each row's `values` (rows, branches, ...) of its `branch` (rows,)."""
    index = branch.view(-1, 1, *([1] * (values.dim() - 2))).expand(-1, 1, *values.shape[2:])
    return values.gather(1, index).squeeze(1)
