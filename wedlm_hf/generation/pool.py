"""A pool of K/V blocks: continuous batching and fixed-shape steps (`wedlm_static`) are one backend.

The dynamic backend (dynamic.py) keeps a batch's K/V as one growing tensor per layer: rows that leave are an
index-select of all of it, rows that join a concatenation of all of it. Here the K/V live in `KVPool`
(kv_pool.py), fixed-size blocks each row holds through its block table (kv_blocks.py):

- a row's K/V are its prompt's, then its committed tokens', at logical positions from 0 to its `end`; each
  forward writes the row's window at the positions from `end` on, the commit moves `end` past the kept K/V, and
  what it does not keep is overwritten by the next window; nothing is cropped;
- before a forward every row holds blocks for its `end` plus the fed columns (`_hold`: free blocks, the pool
  growing by a sixteenth when they run out); a row that leaves frees its blocks, and no K/V move;
- rows enter after their first step (prompt and first window), which runs on the dynamic backend in a batch of
  their own, as `generate` runs it: `PoolBackend.joined_rows` gives each one blocks for its K/V and copies them
  in, and writes nothing else;
- a forward feeds the running rows alone and reads each row's own positions up to the longest running row's,
  under a 4D mask: a query sees its row's K/V before `end` and the live window slots fed before it (feed order
  is causal order).

With `fixed_width` (`wedlm_static=True`, or `cache_implementation="static"`), every row holds one block of
`max_cache_len` positions, its own row's, and every forward feeds that width over every row and every position
(ended rows as dead rows: each query sees only itself, and only the running rows' logits come back): one shape
for the whole call, so `torch.compile` / CUDA graphs capture the step once (compiled with
`model.get_compiled_call(compile_config)`, transformers' machinery, on CUDA or wherever a `compile_config` is
given). Without it (continuous batching), a forward feeds the longest running window over the positions up to
the longest row's plus that width (each row's `end` read in the step's one sync).
"""

import torch
from transformers import GenerationConfig, PreTrainedModel

from .attention import window_attention_kwargs, window_forward
from .cache import WeDLMCache
from .kv_blocks import BLOCK_SIZE, blocks_for
from .kv_pool import KVPool
from .window import RunningRow, Updates

SPARE = 16
"""A pool out of free blocks grows to what it needs plus one block in `SPARE` (a few growths per doubling)."""


class PoolBackend:
    """The forward backend over a `KVPool` for at most `rows` rows; `max_cache_len` and `fixed_width` fix every
    forward's shape (None: blocks follow the rows' positions), `compiled_call` replaces the model's forward."""

    def __init__(
        self,
        model: PreTrainedModel,
        rows: int,
        mask_id: int,
        max_cache_len: int | None = None,
        fixed_width: int | None = None,
        compiled_call=None,
    ):
        self.model, self.rows, self.mask_id, self.fixed_width = model, rows, mask_id, fixed_width
        mask_dtype = model.dtype if model.config._attn_implementation == "eager" else None
        num_layers = model.config.get_text_config(decoder=True).num_hidden_layers
        block_size = BLOCK_SIZE if fixed_width is None else max_cache_len
        self.cache = KVPool(num_layers, block_size, mask_dtype, model.device)
        self.cache.contiguous = fixed_width is not None
        self.ends: list[int] = []
        """Each running row's `end` as the last sync read it (rows growing block by block)."""
        self.index = torch.zeros(0, dtype=torch.long, device=model.device)
        """With `fixed_width`: the pool row of each running row, in running order (rows stay in place)."""
        self.attention_kwargs = window_attention_kwargs(model)
        self.compiled_call = compiled_call

    def shape(self, fed: int, mask_columns: int) -> tuple[int, int]:
        """The longest running window and its mask columns; with `fixed_width`, that width for both."""
        if self.fixed_width is not None:
            return self.fixed_width, self.fixed_width
        return fed, mask_columns

    def sync_values(self, committed: torch.Tensor) -> list[torch.Tensor]:
        """Each running row's `end` after this commit (fixed shapes hold every position already: nothing)."""
        if self.fixed_width is not None:
            return []
        return [self.cache.end + committed]

    def commit(self, committed: torch.Tensor, values: list[int], columns: torch.Tensor | None = None) -> None:
        """Each running row keeps its first `committed` window K/V (those at its fed `columns`, moved into order,
        where given): its `end` moves past them."""
        if columns is not None:
            self.cache.gather_window(columns)
        if self.fixed_width is not None:
            self.cache.end.index_add_(0, self.index, committed)
            return
        self.cache.end = self.cache.end + committed
        self.ends = values

    def select_rows(self, index: torch.Tensor, kept: list[RunningRow]) -> None:
        """Only running rows `kept` (`index` on the device) go on; the others' blocks are free (with
        `fixed_width`, their rows stay, as dead rows)."""
        if self.cache.end is None:
            return
        if self.fixed_width is not None:
            gone = torch.ones(self.index.shape[0], dtype=torch.bool, device=index.device).index_fill_(0, index, False)
            self.cache.end[self.index] = self.cache.end[self.index].masked_fill(gone, 0)
            self.index = self.index[index]
            return
        self.cache.blocks.select(kept, index)
        self.cache.end = self.cache.end[index]
        self.ends = [self.ends[row] for row in kept]

    def joined_rows(self, other) -> Updates:
        """Rows that ran their first step on `other` (a `DynamicBackend`) appended after the running rows: each
        takes free blocks for its cached K/V (with `fixed_width`: its own row's block), which are copied there,
        and nothing else is written (the pool may grow first, which keeps what it holds). Those blocks are free
        until `swap_in`, so an abandoned join changes nothing the running rows read. One host read: each new
        row's K/V count."""
        source: WeDLMCache = other.cache
        count = source.key_mask.shape[0]
        if count == 0:
            return []
        if self.cache.end is None:
            self.cache.allocate(source)
        held = self.cache.end.shape[0]
        if held + count > self.rows:
            raise ValueError(f"{count} rows cannot join a pool of {self.rows} rows holding {held}.")
        blocks, valid = self.cache.blocks, source.valid_per_row.tolist()
        tokens = valid if self.fixed_width is None else [blocks.block_size] * count
        self._make_room(sum(blocks_for(t, blocks.block_size) for t in tokens))
        updates, table = blocks.joined(tokens)
        positions = (source.key_mask.cumsum(1) - 1).clamp(min=0)  # each valid column's position in its row
        self.cache.write(blocks.slots(positions, table)[source.key_mask], source)
        end = torch.cat([self.cache.end, source.valid_per_row])
        if self.fixed_width is not None:
            index = torch.arange(held, held + count, device=self.index.device)
            return updates + [(self.cache, {"end": end}), (self, {"index": torch.cat([self.index, index])})]
        return updates + [(self.cache, {"end": end}), (self, {"ends": self.ends + valid})]

    def _make_room(self, wanted: int) -> None:
        """At least `wanted` free blocks: the pool grows to what it then holds plus one block in `SPARE` (with
        `fixed_width`, exactly: its rows' blocks must be the pool in row order)."""
        blocks = self.cache.blocks
        short = wanted - len(blocks.free)
        if short > 0:
            capacity = blocks.capacity + short
            self.cache.grow(capacity + (-(-capacity // SPARE) if self.fixed_width is None else 0))

    def _hold(self, fed: int) -> int:
        """Every running row holds blocks for its `end` plus `fed` positions; returns the longest row's positions."""
        tokens = [end + fed for end in self.ends]
        missing = self.cache.blocks.missing(tokens)
        self._make_room(sum(missing))
        self.cache.blocks.extend(missing)
        return max(tokens)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        window_live: torch.Tensor,
        mask_slots: torch.Tensor,
        logits_to_keep: int,
        window_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The forward over the running rows (with `fixed_width`, every row, ended ones as dead rows, each running
        row's inputs at its pool row), under the pool's 4D mask; returns the running rows' logits."""
        placed = self.fixed_width is not None and self.index.shape[0] < self.cache.end.shape[0]
        if placed:  # some rows ended: feed every row, the running ones at their pool rows
            rows = self.cache.end.shape[0]
            input_ids = self._placed(input_ids, self.mask_id, rows)
            placed_rows = (self._placed(values, 0, rows) for values in (position_ids, window_live, mask_slots))
            position_ids, window_live, mask_slots = placed_rows
        length = self.cache.blocks.block_size if self.fixed_width is not None else self._hold(input_ids.shape[1])
        attention_mask = self.cache.begin_forward(window_live, length, window_mask)
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
