"""A pool of preallocated K/V rows: fixed-shape steps (`wedlm_static`) and continuous batching are one backend.

The dynamic backend (dynamic.py) keeps a batch's K/V as one growing tensor per layer: rows that leave are an
index-select of all of it, rows that join a concatenation of all of it. Here the K/V live in `KVPool` (kv_pool.py),
a fixed (rows, heads, columns, head_dim) tensor per layer, and each running row holds one pool row (a *slot*):

- a pool row's K/V are contiguous from column 0: the prompt, then the committed tokens (`end`: how many). Each
  forward writes a row's window at its own columns from `end` on (`kv_pool.RowWriteLayer`), the commit moves
  `end` past the kept K/V, and what it does not keep is overwritten by the next window; nothing is cropped;
- rows enter after their first step (prompt and first window), which runs on the dynamic backend in a batch of
  their own, as `generate` runs it: `PoolBackend.joined_rows` copies each one's K/V into the lowest free pool
  row, and nothing else;
- the running rows hold the first pool rows, so a forward's view (no copy) is the running rows alone: the pool
  row a row frees takes the running row from the highest pool row (one row's K/V copied). Fed as dead rows
  instead, 4 rows left running among 8 cost a step what 8 rows cost. The 4D mask lets a query see its row's K/V
  before `end` and the live window slots fed before it (feed order is causal order).

With `fixed_width` (`wedlm_static=True`, or `cache_implementation="static"`), every forward feeds that width over
every pool row and every column (ended rows as dead rows: each query sees only itself, and only the running rows'
logits come back): one shape for the whole call, so `torch.compile` / CUDA graphs capture the step once (compiled
with `model.get_compiled_call(compile_config)`, transformers' machinery, on CUDA or wherever a `compile_config` is
given). Without it (continuous batching), a forward feeds the longest running window over the columns up to the
longest row plus that width (sizes read in the step's one sync). A pool not told its longest sequence grows with
its longest row, by a quarter at a time (`reserve`): growing copies the running rows' K/V, a few times per
doubling of the longest row, never at an admission that fits or at an exit, and the pool holds at most a quarter
(plus 64 columns) more than its longest row needs. Growing by the rows' use rather than their budgets keeps a
request that may run to the model's position limit from reserving that limit in every row.
"""

import torch
from transformers import GenerationConfig, PreTrainedModel

from .attention import window_attention_kwargs, window_forward
from .cache import WeDLMCache
from .kv_pool import KVPool
from .window import RunningRow, Updates, swap_in

GROWTH = 5 / 4
GROWTH_COLUMNS = 64
"""A growing pool grows to `GROWTH` times the columns it needs, rounded up to a multiple of `GROWTH_COLUMNS`."""


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
        """Only running rows `kept` (`index` on the device) go on; the others' pool rows are free, and (without
        `fixed_width`) taken by the running rows above them (`_fill_free_rows`)."""
        gone = torch.ones(len(self.pool_rows), dtype=torch.bool, device=index.device).index_fill_(0, index, False)
        if self.cache.end is not None:
            self.cache.end[self.index] = self.cache.end[self.index].masked_fill(gone, 0)
        self.pool_rows, self.index = [self.pool_rows[row] for row in kept], self.index[index]
        if self.fixed_width is None:
            self._fill_free_rows()

    def _fill_free_rows(self) -> None:
        """Move the running rows held at pool row `len(pool_rows)` or above into the free rows below it (their K/V
        up to the longest row, and `end`), so the running rows hold the first pool rows and no forward feeds a
        free one."""
        count = len(self.pool_rows)
        free = iter(sorted(set(range(count)) - set(self.pool_rows)))
        moves = {i: next(free) for i, row in enumerate(self.pool_rows) if row >= count}
        if not moves:
            return
        source = self.index[list(moves)]
        self.pool_rows = [moves.get(i, row) for i, row in enumerate(self.pool_rows)]
        self.index = torch.tensor(self.pool_rows, dtype=torch.long, device=self.index.device)
        target = self.index[list(moves)]
        for layer in self.cache.layers:
            for values in (layer.keys, layer.values):
                values[target, :, : self.longest] = values[source, :, : self.longest]
        self.cache.end[target] = self.cache.end[source]
        self.cache.end[source] = 0

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
        """The forward over the running rows' pool rows (with `fixed_width`, every pool row, ended ones as dead rows),
        each row's inputs at its pool row, under the pool's 4D mask; returns the running rows' logits."""
        fed = input_ids.shape[1]
        if self.fixed_width is not None:
            view = (self.cache.rows, self.cache.max_cache_len)
        else:
            self.reserve(self.longest + fed)
            view = (max(self.pool_rows) + 1, self.longest + fed)
        placed = self.pool_rows != list(range(view[0]))
        if placed:  # the running rows are not pool rows 0, 1, ... in order: put them there
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
