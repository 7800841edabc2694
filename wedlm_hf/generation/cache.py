"""`WeDLMCache`: a `DynamicCache` that keeps the K/V of committed tokens and drops everything else.

Every WeDLM forward appends a whole window; afterwards only each row's committed slots may stay. Those are the
*first* physical slots of the window (committed tokens are fed first, in order; a tree's forward, `tree.py`,
gathers them there first), so one `crop` to the batch's largest commit keeps them, and rows that committed fewer
mark the surplus as holes in `key_mask`. Holes and left padding are never attended to. Keys carry their RoPE
rotation already, so K/V columns can be moved freely:
`compact` right-aligns every row's valid columns and drops columns no row uses. It runs whenever more than
`max_wasted_slots` columns could be freed, which bounds the wasted slots per row to `max_wasted_slots` plus the
batch's spread of valid lengths (the left padding any rectangular batch needs).

The decoder reads the sizes this needs (largest commit, longest row) in its one host sync per step and passes
them in, so the cache itself never reads a device value.
"""

import torch
from transformers import DynamicCache

from .window import Updates


class WeDLMCache(DynamicCache):
    def __init__(self, key_mask: torch.Tensor, max_wasted_slots: int = 32):
        super().__init__()
        self.key_mask = key_mask.bool()
        """(batch, committed columns): which cached K/V columns a query may attend to."""
        self.valid_per_row = self.key_mask.sum(1)
        self.max_wasted_slots = max_wasted_slots

    def key_valid(self, window_valid: torch.Tensor) -> torch.Tensor:
        """Which keys the next forward may attend to: the committed columns, then this window's live slots (bool)."""
        return torch.cat([self.key_mask, window_valid], dim=1)

    def commit(
        self, num_committed: torch.Tensor, kept: int, longest_valid: int, columns: torch.Tensor | None = None
    ) -> None:
        """After a forward, keep each row's first `num_committed` window K/V (those at the window's `columns`
        (rows, n >= kept), in that order, where given); `kept` is `num_committed.max()` and `longest_valid` the
        largest `valid_per_row` after this commit, both read by the caller."""
        committed_width = self.key_mask.shape[1]
        window_length = self.get_seq_length() - committed_width
        if columns is not None:  # a tree: the kept K/V gathered into order, in place
            index = columns[:, None, :kept, None].clamp(max=window_length - 1)  # (past a row's count: unread)
            expanded = {}  # (one expanded index per K/V shape: layers and keys/values mostly share theirs)
            for layer in self.layers:
                for values in (layer.keys, layer.values):
                    shape = (-1, values.shape[1], -1, values.shape[3])
                    if shape not in expanded:
                        expanded[shape] = index.expand(*shape)
                    window = values[:, :, committed_width:]
                    window[:, :, :kept] = window.gather(2, expanded[shape])
        if kept < window_length:  # (a one-token forward that keeps its token crops nothing)
            self.crop(kept - window_length)
        if kept == 1:  # (a one-token step: the row kept its token or nothing)
            new_columns = num_committed[:, None] > 0
        else:
            new_columns = torch.arange(kept, device=num_committed.device)[None, :] < num_committed[:, None]
        self.key_mask = torch.cat([self.key_mask, new_columns], dim=1)
        self.valid_per_row = self.valid_per_row + num_committed
        if self.key_mask.shape[1] - longest_valid > self.max_wasted_slots:
            self.compact(longest_valid)

    def compact(self, width: int) -> None:
        """Move each row's valid columns to the right end, in order, and keep the last `width` columns (the
        longest row's valid count)."""
        order = torch.sort(self.key_mask.to(torch.int8), dim=1, stable=True).indices[:, -width:]
        for layer in self.layers:
            if not layer.is_initialized:
                continue
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys = layer.keys.gather(2, index)
            layer.values = layer.values.gather(2, index)
        self.key_mask = self.key_mask.gather(1, order)

    def joined(self, other: "WeDLMCache") -> Updates:
        """`other`'s rows appended (continuous batching without a pool: requests join the running batch), built
        without touching this cache (`swap_in` sets them): every layer's K/V of every row are copied. The narrower
        cache is padded on the left to the wider one's columns; padding is never attended to, like left padding."""
        if self.key_mask.shape[0] == 0:
            return [(self, {"layers": other.layers, "key_mask": other.key_mask, "valid_per_row": other.valid_per_row})]
        width = max(self.key_mask.shape[1], other.key_mask.shape[1])
        updates: Updates = [
            (mine, {
                "keys": torch.cat([_left_padded(mine.keys, width), _left_padded(theirs.keys, width)]),
                "values": torch.cat([_left_padded(mine.values, width), _left_padded(theirs.values, width)]),
            })
            for mine, theirs in zip(self.layers, other.layers)
        ]
        return updates + [(self, {
            "key_mask": torch.cat([_left_padded(self.key_mask, width), _left_padded(other.key_mask, width)]),
            "valid_per_row": torch.cat([self.valid_per_row, other.valid_per_row]),
        })]

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only `rows` of the batch (finished rows leave the batch)."""
        self.batch_select_indices(rows)
        self.key_mask = self.key_mask[rows]
        self.valid_per_row = self.valid_per_row[rows]


def _left_padded(columns: torch.Tensor, width: int) -> torch.Tensor:
    """`columns` (rows, ..., columns[, dim] for K/V; rows, columns for the key mask) with zeros (False) prepended
    up to `width` columns."""
    axis = 1 if columns.dim() == 2 else 2
    shape = list(columns.shape)
    shape[axis] = width - shape[axis]
    return torch.cat([columns.new_zeros(shape), columns], dim=axis)
