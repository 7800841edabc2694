"""User stopping criteria over a multi-token commit: the first token after which one fires, where transformers'
greedy `generate()` would have stopped, at the cost of the new tokens rather than of the whole sequence.

AR decoding checks its criteria after every token; a WeDLM commit writes several at once. The commit's tokens are
written after the row's committed ones first, so the prefix ending at each is a view of the row, never a copy.
A `StopStringCriteria` reads only its last `maximum_token_len` ids and keeps no state, so it is called once per
commit, on every token's tail at once. Any other criterion may read the whole prefix and keep state, so it is handed
the prefixes `generate()` would hand it, one per token, in order, up to the stop.
"""

import torch
from transformers import StoppingCriteria, StopStringCriteria


def first_stop(criteria: list[StoppingCriteria], row: torch.Tensor, end: int, count: int) -> int | None:
    """Index among the `count` new tokens `row[end : end + count]` of the first after which a criterion fires, or
    None; `row` holds one sequence's ids, the prompt and committed tokens before `end`."""
    known = [criterion for criterion in criteria if _reach(criterion) is not None]
    unknown = [criterion for criterion in criteria if _reach(criterion) is None]
    fired = torch.zeros(count, dtype=torch.bool, device=row.device)
    for criterion in known:
        fired |= _tail_checks(criterion, row, end, count)
    hits = fired.nonzero().flatten().tolist()  # the commit's one host read, where every criterion is known
    first = hits[0] if hits else None
    if unknown:
        for t in range(count if first is None else first + 1):
            prefix = row[None, : end + t + 1]
            if any([_fires(criterion(prefix, None)) for criterion in unknown]):  # all called, as generate() does
                return t
    return first


def _reach(criterion: StoppingCriteria) -> int | None:
    """How many trailing ids `criterion` reads, where that is known (transformers' own stop strings, not a subclass
    that may read more); None for any other."""
    return criterion.maximum_token_len if type(criterion) is StopStringCriteria else None


def _tail_checks(criterion: StoppingCriteria, row: torch.Tensor, end: int, count: int) -> torch.Tensor:
    """Whether `criterion` fires after each of the `count` new tokens, in one call on (count, reach) tails; the
    tokens whose whole prefix is shorter than the reach (only right after a short prompt) get their prefix alone."""
    reach = _reach(criterion)
    first_full = max(0, min(count, reach - end - 1))
    results = [criterion(row[None, : end + t + 1], None) for t in range(first_full)]
    if first_full < count:
        results.append(criterion(row[end + first_full + 1 - reach : end + count].unfold(0, reach, 1), None))
    return torch.cat([torch.as_tensor(result, device=row.device).reshape(-1) for result in results])


def _fires(result: torch.Tensor | bool) -> bool:
    """A criterion's verdict on one prefix; older criteria (lm-evaluation-harness's stop sequences) return a plain
    bool, which transformers' `StoppingCriteriaList` accepts too."""
    return bool(torch.as_tensor(result).any())
