"""`KVPool`: the pool backend's K/V (pool.py), a fixed (rows, heads, columns, head_dim) tensor per layer whose
rows each hold one running row's K/V, contiguous from column 0 (`end`: how many before the next window). A forward
writes each row's window in place at its own columns and attends over a view of the first rows and columns; the
pool builds that forward's 4D mask and write positions itself (`begin_forward`)."""

import torch
from transformers.cache_utils import Cache, StaticLayer

from .attention import additive_mask
from .cache import WeDLMCache
from .window import Updates


class RowWriteLayer(StaticLayer):
    """A `StaticLayer` whose rows write their new K/V at their own columns, and whose attention reads a view of the
    first rows and columns (`KVPool.view`)."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, write_index: dict, view: tuple):
        """Write at `write_index[heads]` (`KVPool._write_index`; a quarter of a `scatter_`'s cost on a CPU), the new
        K/V read in (rows, fed, heads) order: their memory order as attention modules project them, so no copy."""
        rows, length = view
        index = write_index[key_states.shape[1]]
        for pool, new in ((self.keys, key_states), (self.values, value_states)):
            pool.view(-1, pool.shape[-1]).index_copy_(0, index, new.transpose(1, 2).reshape(-1, new.shape[-1]))
        return self.keys[:rows, :, :length], self.values[:rows, :, :length]


class KVPool(Cache):
    """`rows` pool rows of `max_cache_len` K/V columns per layer, allocated from the first K/V copied in (their
    heads, head sizes, dtype and device); builds each forward's 4D mask and write columns itself."""

    max_cache_len: int = 0  # settable: transformers 5.19's `Cache` has a read-only `max_cache_len` (5.20 dropped it)

    def __init__(self, num_layers: int, rows: int, max_cache_len: int, mask_dtype: torch.dtype | None):
        super().__init__(layers=[RowWriteLayer(max_cache_len) for _ in range(num_layers)])
        self.rows, self.max_cache_len = rows, max_cache_len
        self.mask_dtype = mask_dtype
        """None: a boolean mask (True = attend); a float dtype: an additive mask (eager attention)."""
        self.end: torch.Tensor | None = None
        """(rows,) each pool row's K/V columns before its next window (0 for a free row); None until allocated."""
        self.view = (rows, max_cache_len)
        self.write_index: dict[int, torch.Tensor] = {}
        """Per K/V head count, where the next forward writes (`_write_index`), set with its mask."""

    def allocate(self, source: WeDLMCache) -> None:
        """Allocate every layer like `source`'s (one row of it is enough)."""
        for layer, like in zip(self.layers, source.layers):
            layer.lazy_initialization(
                like.keys[:1].expand(self.rows, -1, -1, -1), like.values[:1].expand(self.rows, -1, -1, -1)
            )
        self.end = torch.zeros(self.rows, dtype=torch.long, device=source.key_mask.device)

    def grown(self, max_cache_len: int) -> Updates:
        """Every layer's K/V in `max_cache_len` columns, the current ones copied in front."""
        updates: Updates = [(self, {"max_cache_len": max_cache_len, "view": (self.rows, max_cache_len)})]
        for layer in self.layers:
            values = {"max_cache_len": max_cache_len}
            if layer.is_initialized:
                for name in ("keys", "values"):
                    old = getattr(layer, name)
                    values[name] = old.new_zeros((*old.shape[:2], max_cache_len, old.shape[-1]))
                    values[name][:, :, : old.shape[2]] = old
            updates.append((layer, values))
        return updates

    def gather_window(self, rows: torch.Tensor, columns: torch.Tensor) -> None:
        """Pool rows `rows` take, at their window's first columns, the K/V their last forward wrote at window
        columns `columns` (rows, n): a tree's kept K/V moved into order."""
        end, last = self.end[rows][:, None], self.max_cache_len - 1
        source = (end + columns).clamp(max=last)
        target = (end + torch.arange(columns.shape[1], device=columns.device)).clamp(max=last)
        for layer in self.layers:
            for values in (layer.keys, layer.values):  # (indexed: rows, columns, heads, head_dim)
                values[rows[:, None], :, target] = values[rows[:, None], :, source]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        return self.layers[layer_idx].update(key_states, value_states, self.write_index, self.view)

    def get_seq_length(self, layer_idx: int = 0) -> torch.Tensor:
        """The longest row's K/V (a tensor, like `StaticLayer`'s, so no host sync)."""
        return self.end.max()

    def begin_forward(
        self, window_live: torch.Tensor, view: tuple[int, int], window_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Prepare a forward over the first `view[0]` pool rows and `view[1]` columns, whose windows' live slots
        are `window_live` (a free row: none): set where it writes and return its (rows, 1, fed, columns) mask
        (among the fed columns, causal order, or `window_mask` (rows, fed, fed): a tree's)."""
        rows, length = view
        fed = window_live.shape[1]
        end, columns = self.end[:rows], torch.arange(length, device=window_live.device)
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
        self.write_index, self.view = self._write_index(queries), view
        if self.mask_dtype is not None:
            mask = additive_mask(mask, self.mask_dtype)
        return mask[:, None]

    def _write_index(self, columns: torch.Tensor) -> dict[int, torch.Tensor]:
        """Per head count of the layers, where each (view row, fed slot, head) lands in a layer's K/V flattened to
        rows x heads x columns, for `columns` (view rows, fed)."""
        index = {}
        for heads in {layer.keys.shape[1] for layer in self.layers}:
            rows = torch.arange(columns.shape[0] * heads, device=columns.device).view(-1, 1, heads)
            index[heads] = (rows * self.max_cache_len + columns[:, :, None]).view(-1)
        return index
