"""A pool of preallocated K/V rows: fixed-shape steps (`wedlm_static`) and continuous batching are one backend.

The dynamic backend (dynamic.py) keeps a batch's K/V as one growing tensor per layer: rows that leave are an
index-select of all of it, rows that join a concatenation of all of it. Here the K/V live in `KVPool`, a fixed
(rows, heads, columns, head_dim) tensor per layer, and each running row holds one pool row (a *slot*) for its
whole life:

- a pool row's K/V are contiguous from column 0: the prompt, then the committed tokens (`end`: how many). Each
  forward writes a row's window at its own columns from `end` on (`RowWriteLayer`), the commit moves `end` past
  the kept K/V, and what it does not keep is overwritten by the next window; nothing is cropped or moved;
- rows enter after their first step (prompt and first window), which runs on the dynamic backend in a batch of
  their own, as `generate` runs it: `PoolBackend.joined_rows` copies each one's K/V into a free pool row, and
  nothing else; a row that ends frees its pool row, and nothing moves;
- free rows are handed out lowest first, so a forward covers the pool rows up to the highest one in use (a view,
  no copy); free rows among them are fed as dead rows (every query sees only itself), and only the running rows'
  logits come back. The 4D mask lets a query see its row's K/V before `end` and the live window slots fed before
  it (feed order is causal order).

With `fixed_width` (`wedlm_static=True`, or `cache_implementation="static"`), every forward feeds that width over
every pool row and every column: one shape for the whole call, so `torch.compile` / CUDA graphs capture the step
once (compiled with `model.get_compiled_call(compile_config)`, transformers' machinery, on CUDA or wherever a
`compile_config` is given). Without it (continuous batching), a forward feeds the longest running window over the
columns up to the longest row plus that width (sizes read in the step's one sync). A pool not told its longest
sequence grows with its longest row, by a quarter at a time (`reserve`): growing copies the running rows' K/V, a
few times per doubling of the longest row, never at an admission that fits or at an exit, and the pool holds at
most a quarter (plus 64 columns) more than its longest row needs. Growing by the rows' use rather than their
budgets keeps a request that may run to the model's position limit from reserving that limit in every row.
"""

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.cache_utils import Cache, StaticLayer

from .attention import additive_mask, window_attention_kwargs, window_forward
from .cache import WeDLMCache
from .window import RunningRow, Updates, swap_in

GROWTH = 5 / 4
GROWTH_COLUMNS = 64
"""A growing pool grows to `GROWTH` times the columns it needs, rounded up to a multiple of `GROWTH_COLUMNS`."""


class RowWriteLayer(StaticLayer):
    """A `StaticLayer` whose rows write their new K/V at their own columns, in a view of the first rows and
    columns (`KVPool.view`)."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, columns: torch.Tensor, view: tuple):
        rows, length = view
        keys, values = self.keys[:rows, :, :length], self.values[:rows, :, :length]
        index = columns[:, None, :, None]
        keys.scatter_(2, index.expand(-1, keys.shape[1], -1, keys.shape[-1]), key_states)
        values.scatter_(2, index.expand(-1, values.shape[1], -1, values.shape[-1]), value_states)
        return keys, values


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
        self.write_columns: torch.Tensor | None = None
        """(view rows, fed) the column each token of the next forward writes, set with its mask."""

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
        return self.layers[layer_idx].update(key_states, value_states, self.write_columns, self.view)

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
        self.write_columns, self.view = queries, view
        if self.mask_dtype is not None:
            mask = additive_mask(mask, self.mask_dtype)
        return mask[:, None]


class PoolBackend:
    """The forward backend over a `KVPool` of `rows` rows; `max_cache_len` fixes its columns (None: it grows to
    what `reserve` asks), `fixed_width` fixes every forward's shape, `compiled_call` replaces the model's forward."""

    def __init__(
        self,
        model: PreTrainedModel,
        rows: int,
        mask_id: int,
        max_cache_len: int | None = None,
        fixed_width: int | None = None,
        compiled_call=None,
    ):
        self.model, self.mask_id, self.fixed_width = model, mask_id, fixed_width
        self.grows = max_cache_len is None
        mask_dtype = model.dtype if model.config._attn_implementation == "eager" else None
        num_layers = model.config.get_text_config(decoder=True).num_hidden_layers
        self.cache = KVPool(num_layers, rows, max_cache_len or 0, mask_dtype)
        self.pool_rows: list[int] = []
        """The pool row of each running row, in running order."""
        self.index = torch.zeros(0, dtype=torch.long, device=model.device)
        """`pool_rows` on the device."""
        self.longest = 0
        """At least the longest running row's `end` (read in the step sync): forwards view the columns up to it
        plus the window."""
        self.attention_kwargs = window_attention_kwargs(model)
        self.compiled_call = compiled_call

    def reserve(self, columns: int) -> None:
        """Make room for rows of `columns` K/V columns: a growing pool grows (copying what it holds), a fixed one
        refuses."""
        if columns <= self.cache.max_cache_len:
            return
        if not self.grows:
            raise ValueError(f"A row needs {columns} cache columns; the pool holds {self.cache.max_cache_len}.")
        wanted = int(max(columns, self.cache.max_cache_len) * GROWTH)
        swap_in(self.cache.grown(-(-wanted // GROWTH_COLUMNS) * GROWTH_COLUMNS))

    def shape(self, fed: int, mask_columns: int) -> tuple[int, int]:
        """The longest running window and its mask columns; with `fixed_width`, that width for both."""
        if self.fixed_width is not None:
            return self.fixed_width, self.fixed_width
        return fed, mask_columns

    def sync_values(self, committed: torch.Tensor) -> list[torch.Tensor]:
        """The longest running row after this commit (fixed shapes view every column: nothing)."""
        if self.fixed_width is not None:
            return []
        return [(self.cache.end[self.index] + committed).max()]

    def commit(self, committed: torch.Tensor, values: list[int], columns: torch.Tensor | None = None) -> None:
        """Each running row keeps its first `committed` window K/V (those at its fed `columns`, moved into order,
        where given): its `end` moves past them."""
        if columns is not None:
            self.cache.gather_window(self.index, columns)
        self.cache.end.index_add_(0, self.index, committed)
        if values:
            self.longest = values[0]

    def select_rows(self, index: torch.Tensor, kept: list[RunningRow]) -> None:
        """Only running rows `kept` (`index` on the device) go on; the others' pool rows are free, their K/V left
        where they are."""
        gone = torch.ones(len(self.pool_rows), dtype=torch.bool, device=index.device).index_fill_(0, index, False)
        if self.cache.end is not None:
            self.cache.end[self.index] = self.cache.end[self.index].masked_fill(gone, 0)
        self.pool_rows, self.index = [self.pool_rows[row] for row in kept], self.index[index]

    def joined_rows(self, other) -> Updates:
        """Rows that ran their first step on `other` (a `DynamicBackend`) take the lowest free pool rows, appended
        after the running rows: each one's cached K/V are copied into its own pool row, valid columns first, and
        nothing else is written (unless the pool must grow first, which keeps what it holds). Those rows are free
        until `swap_in`, so an abandoned join changes nothing the running rows read."""
        source: WeDLMCache = other.cache
        count, width = source.key_mask.shape
        if count == 0:
            return []
        taken = set(self.pool_rows)
        free = [row for row in range(self.cache.rows) if row not in taken][:count]
        if len(free) < count:
            raise ValueError(f"{count} rows cannot join a pool with {len(free)} free rows.")
        self.reserve(width)
        if self.cache.end is None:
            self.cache.allocate(source)
        rows = torch.tensor(free, dtype=torch.long, device=self.index.device)
        valid_first = torch.sort((~source.key_mask).to(torch.int8), dim=1, stable=True).indices[:, None, :, None]
        for mine, theirs in zip(self.cache.layers, source.layers):
            for name in ("keys", "values"):
                values = getattr(theirs, name)
                getattr(mine, name)[rows, :, :width] = values.gather(2, valid_first.expand_as(values))
        end = self.cache.end.index_put((rows,), source.valid_per_row)
        pool = {"pool_rows": self.pool_rows + free, "index": torch.cat([self.index, rows])}
        return [(self.cache, {"end": end}), (self, {**pool, "longest": max(self.longest, width)})]

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        window_live: torch.Tensor,
        mask_slots: torch.Tensor,
        logits_to_keep: int,
        window_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The forward over the pool rows up to the highest in use (with `fixed_width`, all), the running rows'
        inputs at their pool rows and dead rows elsewhere, under the pool's 4D mask; returns the running rows'
        logits."""
        fed = input_ids.shape[1]
        if self.fixed_width is not None:
            view = (self.cache.rows, self.cache.max_cache_len)
        else:
            self.reserve(self.longest + fed)
            view = (max(self.pool_rows) + 1, self.longest + fed)
        placed = self.pool_rows != list(range(view[0]))
        if placed:  # the running rows are not pool rows 0, 1, ... in order: scatter them there
            input_ids = self._placed(input_ids, self.mask_id, view[0])
            placed_rows = (self._placed(values, 0, view[0]) for values in (position_ids, window_live, mask_slots))
            position_ids, window_live, mask_slots = placed_rows
            window_mask = None if window_mask is None else self._placed(window_mask, False, view[0])
        attention_mask = self.cache.begin_forward(window_live, view, window_mask)
        call = self.compiled_call if self.compiled_call is not None else self.model
        logits = window_forward(
            call, self.cache, input_ids, attention_mask, position_ids, logits_to_keep, mask_slots,
            **self.attention_kwargs,
        )
        if placed or self.compiled_call is not None:  # a copy: a CUDA graph's output is overwritten by its next replay
            return logits.index_select(0, self.index)
        return logits

    def _placed(self, values: torch.Tensor, fill, rows: int) -> torch.Tensor:
        """(rows, ...) `fill`, with the running rows' `values` at their pool rows."""
        return values.new_full((rows, *values.shape[1:]), fill).index_copy(0, self.index, values)


def compiles(model: PreTrainedModel, generation_config: GenerationConfig) -> bool:
    """Compile on CUDA, or anywhere the caller passed a `compile_config`, unless `disable_compile`."""
    if generation_config.disable_compile:
        return False
    return model.device.type == "cuda" or generation_config.compile_config is not None
