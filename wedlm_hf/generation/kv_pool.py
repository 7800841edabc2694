"""`KVPool`: the pool backend's K/V (pool.py) in fixed-size blocks: per layer one (slots, heads, head_dim) tensor
for keys and one for values, each row's logical positions mapped to slots by its block table (kv_blocks.py).

A forward writes each row's fed columns at the slots of its positions `end`, `end + 1`, ... (feed order: the
committed tokens' K/V first, then the window's; what the next commit does not keep is overwritten by the next
window, as before), then reads each row's positions 0 .. longest row through its own table (one `index_select`
per layer and tensor; a row's positions past its own are clamped to its last, so it reads its own blocks alone),
so attention covers the rows' own K/V, never a budget or the position limit. With one block per row in row order
(the static path's fixed shapes) the read is a view instead. The pool builds that forward's 4D mask and slot
indices itself (`begin_forward`)."""

import torch
from transformers.cache_utils import Cache, StaticLayer

from .attention import additive_mask
from .cache import WeDLMCache
from .kv_blocks import BlockTable


class BlockLayer(StaticLayer):
    """A `StaticLayer` whose K/V are the pool's slots: its rows write at their own slots and read their own
    positions (`KVPool.write_slots`, `KVPool.read_slots`)."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, pool: "KVPool"):
        """The new K/V read in (rows, fed, heads) order, their memory order as attention modules project them;
        returned as (rows, heads, positions, head_dim), the order attention takes."""
        rows, heads, _, dim = key_states.shape
        read = []
        for storage, new in ((self.keys, key_states), (self.values, value_states)):
            storage.index_copy_(0, pool.write_slots, new.transpose(1, 2).reshape(-1, heads, dim))
            rows_read = storage if pool.read_slots is None else storage.index_select(0, pool.read_slots)
            read.append(rows_read.view(rows, -1, heads, dim).transpose(1, 2))
        return tuple(read)


class KVPool(Cache):
    """Blocks of `block_size` positions per layer, allocated from the first K/V copied in (their heads, head sizes,
    dtype and device); `contiguous`: every row holds one block, its own row's, and forwards read them all as a
    view. Builds each forward's 4D mask and slot indices itself."""

    def __init__(self, num_layers: int, block_size: int, mask_dtype: torch.dtype | None, device: torch.device):
        super().__init__(layers=[BlockLayer(block_size) for _ in range(num_layers)])
        self.blocks = BlockTable(block_size, device)
        self.mask_dtype = mask_dtype
        """None: a boolean mask (True = attend); a float dtype: an additive mask (eager attention)."""
        self.contiguous = False
        self.end: torch.Tensor | None = None
        """(rows,) each row's committed K/V: the positions before its next window; None until allocated."""
        self.write_slots: torch.Tensor | None = None
        """Where the forward in progress writes each (row, fed column), flattened (`begin_forward`)."""
        self.read_slots: torch.Tensor | None = None
        """Which slot each (row, position) the forward in progress reads, flattened; None: every slot, as a view."""

    def allocate(self, source: WeDLMCache) -> None:
        """Empty storage in every layer, like `source`'s K/V (one row of it is enough); `grow` adds blocks."""
        for layer, like in zip(self.layers, source.layers):
            for name in ("keys", "values"):
                values = getattr(like, name)
                setattr(layer, name, values.new_zeros((0, values.shape[1], values.shape[3])))
            layer.is_initialized = True
        self.end = torch.zeros(0, dtype=torch.long, device=source.key_mask.device)

    def grow(self, capacity: int) -> None:
        """Hold `capacity` blocks: each tensor is copied into a larger one in turn (so one extra tensor at most is
        alive), block ids kept, so what any row reads is unchanged (a grow needs no undoing if a join fails)."""
        slots = capacity * self.blocks.block_size
        for layer in self.layers:
            for name in ("keys", "values"):
                old = getattr(layer, name)
                new = old.new_zeros((slots, *old.shape[1:]))
                new[: old.shape[0]] = old
                setattr(layer, name, new)
        self.blocks.add_capacity(capacity)

    def write(self, slots: torch.Tensor, source: WeDLMCache) -> None:
        """Copy `source`'s valid K/V (`key_mask`, row by row, in column order) into `slots` of every layer."""
        for mine, theirs in zip(self.layers, source.layers):
            for name in ("keys", "values"):
                getattr(mine, name).index_copy_(0, slots, getattr(theirs, name).transpose(1, 2)[source.key_mask])

    def gather_window(self, columns: torch.Tensor) -> None:
        """Each row takes, at its window's first positions, the K/V the last forward wrote at its fed columns
        `columns` (rows, n): a tree's kept K/V moved into order (past a row's kept count: of no meaning)."""
        fed = self.write_slots.numel() // self.end.shape[0]
        written = self.write_slots.view(-1, fed)
        count = min(columns.shape[1], fed)
        source, target = written.gather(1, columns[:, :count].clamp(max=fed - 1)), written[:, :count]
        for layer in self.layers:
            for values in (layer.keys, layer.values):
                values.index_copy_(0, target.flatten(), values.index_select(0, source.flatten()))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        return self.layers[layer_idx].update(key_states, value_states, self)

    def get_seq_length(self, layer_idx: int = 0) -> torch.Tensor:
        """The longest row's K/V (a tensor, like `StaticLayer`'s, so no host sync)."""
        return self.end.max()

    def begin_forward(
        self, window_live: torch.Tensor, length: int, window_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Prepare a forward of every row over positions 0 .. `length`, whose windows' live slots are `window_live`
        (a dead row: none; every row holds blocks for its `end` plus the fed columns): set where it writes and
        reads, and return its (rows, 1, fed, length) mask (among the fed columns, causal order, or `window_mask`
        (rows, fed, fed): a tree's)."""
        fed = window_live.shape[1]
        end, columns = self.end, torch.arange(length, device=window_live.device)
        queries = end[:, None] + columns[None, :fed]
        offset = columns[None, :] - end[:, None]
        in_window = (offset >= 0) & (offset < fed) & window_live.bool().gather(1, offset.clamp(0, fed - 1))
        valid = (offset < 0) | in_window
        keys = columns[None, None, :]
        order = keys <= queries[..., None]
        if window_mask is not None:
            tree = window_mask.gather(2, offset.clamp(0, fed - 1)[:, None, :].expand(-1, fed, -1))
            order = torch.where(in_window[:, None, :], tree, order)
        # every query sees at least itself, so dead queries never meet an all-masked row (NaN)
        mask = (order & valid[:, None, :]) | (keys == queries[..., None])
        if self.contiguous:
            self.write_slots, self.read_slots = self.blocks.slots(queries).flatten(), None
        else:
            read = self.blocks.slots(torch.minimum(columns[None, :], queries[:, -1:]))
            self.write_slots, self.read_slots = read.gather(1, queries).flatten(), read.flatten()
        if self.mask_dtype is not None:
            mask = additive_mask(mask, self.mask_dtype)
        return mask[:, None]
