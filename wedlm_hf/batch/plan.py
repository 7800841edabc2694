"""Length-bucketed batches: rows with equal generation overrides, similar prompt lengths, left-padded together.

Sorting by prompt length keeps padding (wasted compute) small; grouping by overrides lets one `generate` call serve
a whole batch, so every row's own settings are honoured exactly.
"""

import json
from dataclasses import dataclass

from .rows import PromptRow, RowError


@dataclass
class Batch:
    rows: list[PromptRow]
    token_ids: list[list[int]]
    overrides: dict

    @property
    def longest(self) -> int:
        return max(len(ids) for ids in self.token_ids)


def encode(tokenizer, row: PromptRow) -> list[int]:
    """The prompt's token ids; "messages" go through the tokenizer's chat template with the generation prompt."""
    if row.messages is not None:
        if not getattr(tokenizer, "chat_template", None):
            raise RowError(f'{row.where}: "messages" needs a tokenizer with a chat template; this one has none. '
                           'Give a "prompt" string instead.')
        text = tokenizer.apply_chat_template(row.messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(row.prompt)["input_ids"]
    if not ids:
        raise RowError(f"{row.where}: the prompt encodes to no tokens.")
    return list(ids)


def plan_batches(
    rows: list[PromptRow],
    token_ids: list[list[int]],
    batch_size: int,
    max_padded_tokens: int | None,
    new_tokens: dict[str, int],
) -> list[Batch]:
    """Batches of at most `batch_size` rows and, if set, at most `max_padded_tokens` padded tokens (rows x (longest
    prompt + max_new_tokens), the cache a left-padded batch needs; not continuous batching's `max_batch_tokens`, a
    sum over requests of their own lengths). `new_tokens` maps each override group's key (`group_key`) to its
    max_new_tokens."""
    groups: dict[str, list[int]] = {}
    for position, row in enumerate(rows):
        groups.setdefault(group_key(row.overrides), []).append(position)
    batches = []
    for key, positions in groups.items():
        positions.sort(key=lambda p: (len(token_ids[p]), rows[p].index))
        current: list[int] = []
        for position in positions:
            candidate = current + [position]
            cost = len(candidate) * (len(token_ids[position]) + new_tokens[key])  # sorted: this row is the longest
            too_many = max_padded_tokens is not None and cost > max_padded_tokens
            if current and (len(candidate) > batch_size or too_many):
                batches.append(current)
                candidate = [position]
            current = candidate
        if current:
            batches.append(current)
    return [
        Batch([rows[p] for p in batch], [token_ids[p] for p in batch], rows[batch[0]].overrides) for batch in batches
    ]


def group_key(overrides: dict) -> str:
    return json.dumps(overrides, sort_keys=True)
