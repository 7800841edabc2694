"""Static shapes for WeDLM decoding (`wedlm_static=True`), so `torch.compile` / CUDA graphs capture a step once.

Three things vary between steps of the default decoder: the width fed (the batch's longest window), the batch
(finished rows leave it) and the cache (committed K/V appended, uncommitted ones cropped). Here, after the first
forward (prompt + first window, which has the prompt's shape and runs eagerly, as the prefill does in
transformers' own compiled decoding):

- every forward feeds `2 * window_size` slots, the widest a window gets; slots beyond a row's window are dead;
- finished rows stay in the forward as all-dead rows, and only the live rows' logits are handed back;
- `WindowStaticCache` preallocates prompt + `max_new_tokens` + width columns per row. Row r writes its window
  right after its own committed tokens, so committed K/V stay contiguous and a step's uncommitted slots are simply
  overwritten by the next step's writes at the same columns. The 4D mask lets a query see its row's prompt
  (minus padding), its committed tokens and the live window slots fed before it (feed order is causal order).

Selected by `wedlm_static=True` or transformers' own `cache_implementation="static"`. The forward is compiled with
`model.get_compiled_call(generation_config.compile_config)` (transformers' machinery) on a CUDA device, or on any
device when a `compile_config` is given; `disable_compile=True` turns it off. `max_cache_len` sizes the cache for
the longest call, so calls with other prompt lengths reuse the compiled step.
"""

import torch
from transformers import GenerationConfig, PreTrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache, StaticLayer

from .attention import additive_mask, window_attention_kwargs, window_forward


class RowWriteLayer(StaticLayer):
    """A `StaticLayer` whose rows write their new K/V at their own columns instead of one shared position."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, columns: torch.Tensor):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        index = columns[:, None, :, None]
        self.keys.scatter_(2, index.expand(-1, self.keys.shape[1], -1, self.keys.shape[-1]), key_states)
        self.values.scatter_(2, index.expand(-1, self.values.shape[1], -1, self.values.shape[-1]), value_states)
        return self.keys, self.values


class WindowStaticCache(Cache):
    """Preallocated K/V for WeDLM windows: the same shapes at every step, whatever each row commits.

    Builds each forward's 4D mask and write columns itself (`begin_forward`); rows never leave: `rows` lists the
    ones still decoding, and the masks and writes cover the whole batch.
    """

    def __init__(self, config: PreTrainedConfig, prompt_mask: torch.Tensor, max_cache_len: int, mask_dtype=None):
        batch_size, self.prompt_length = prompt_mask.shape
        self.max_cache_len = max_cache_len
        num_layers = config.get_text_config(decoder=True).num_hidden_layers
        super().__init__(layers=[RowWriteLayer(self.max_cache_len) for _ in range(num_layers)])
        device = prompt_mask.device
        self.mask_dtype = mask_dtype
        """None: a boolean mask (True = attend); a float dtype: an additive mask (eager attention)."""
        self.columns = torch.arange(self.max_cache_len, device=device)
        self.prompt_valid = torch.ones(batch_size, self.max_cache_len, dtype=torch.bool, device=device)
        self.prompt_valid[:, : self.prompt_length] = prompt_mask.bool()
        self.prompt_tokens = prompt_mask.long().sum(1)
        self.committed = torch.zeros(batch_size, dtype=torch.long, device=device)
        """Window tokens committed per row: row r's next window starts at column prompt_length + committed[r]."""
        self.rows = torch.arange(batch_size, device=device)
        self.prefilled = False
        self.write_columns: torch.Tensor | None = None
        """(batch, fed) cache column of every token of the next forward, set with its mask."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        return self.layers[layer_idx].update(key_states, value_states, self.write_columns)

    def get_seq_length(self, layer_idx: int = 0) -> torch.Tensor:
        """Prompt plus the longest row's committed tokens (a tensor, like `StaticLayer`'s, so no host sync)."""
        return self.prompt_length + self.committed.max()

    def begin_forward(self, window_live: torch.Tensor) -> torch.Tensor:
        """Prepare the next forward, whose windows' live slots are `window_live` for the rows still decoding: set
        where it writes (`write_columns`) and return its (batch, 1, fed, columns) mask. The first forward also
        feeds the prompt."""
        batch_size, fed = self.committed.shape[0], window_live.shape[1]
        live = torch.zeros(batch_size, fed, dtype=torch.bool, device=window_live.device)
        live = live.index_copy(0, self.rows, window_live.bool())
        start = self.prompt_length + self.committed
        window_columns = start[:, None] + self.columns[None, :fed]
        offset = self.columns[None, :] - start[:, None]
        in_window = (offset >= 0) & (offset < fed) & live.gather(1, offset.clamp(0, fed - 1))
        valid = self.prompt_valid & ((offset < 0) | in_window)
        if self.prefilled:
            queries = window_columns
        else:
            queries = torch.cat([self.columns[None, : self.prompt_length].expand(batch_size, -1), window_columns], 1)
        self.write_columns = queries
        keys = self.columns[None, None, :]
        # every query sees at least itself, so padding and dead queries never meet an all-masked row (NaN)
        mask = ((keys <= queries[..., None]) & valid[:, None, :]) | (keys == queries[..., None])
        if self.mask_dtype is not None:
            mask = additive_mask(mask, self.mask_dtype)
        return mask[:, None]

    def commit(self, num_committed: torch.Tensor) -> None:
        """After a forward, keep each live row's first `num_committed` window slots (the rest get overwritten)."""
        self.committed.index_add_(0, self.rows, num_committed)
        self.prefilled = True

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep decoding only `rows` (indices into the rows still decoding); the others stay in as dead rows."""
        self.rows = self.rows[rows]


class StaticBackend:
    """Fixed-width feeds over the whole batch into a `WindowStaticCache`, compiled when `compiles` says so."""

    def __init__(
        self,
        model: PreTrainedModel,
        prompt_mask: torch.Tensor,
        generation_config: GenerationConfig,
        width: int,
        max_new_tokens: int,
        mask_id: int,
    ):
        self.model = model
        self.width = width
        self.mask_id = mask_id
        mask_dtype = model.dtype if model.config._attn_implementation == "eager" else None
        # as in transformers' static cache, `max_cache_len` sizes the cache for the longest call, so later calls
        # with other prompt lengths reuse the compiled step
        needed = prompt_mask.shape[1] + max_new_tokens + width
        max_cache_len = max(needed, generation_config.max_cache_len or 0)
        self.cache = WindowStaticCache(model.config, prompt_mask, max_cache_len, mask_dtype)
        self.attention_kwargs = window_attention_kwargs(model)
        self.compiled_call = None
        if compiles(model, generation_config):
            self.compiled_call = model.get_compiled_call(generation_config.compile_config)

    def shape(self, fed: int, mask_columns: int) -> tuple[int, int]:
        """Every forward feeds (and keeps the logits of) the full width."""
        return self.width, self.width

    def sync_values(self, committed: torch.Tensor) -> list[torch.Tensor]:
        """Nothing: committing crops nothing here."""
        return []

    def commit(self, committed: torch.Tensor, values: list[int]) -> None:
        self.cache.commit(committed)

    def select_rows(self, index: torch.Tensor) -> None:
        self.cache.select_rows(index)

    def join_rows(self, other: "StaticBackend") -> None:
        raise ValueError(
            "`wedlm_static=True` preallocates a fixed batch, so no request can join it (continuous batching); use "
            "wedlm_static=False."
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        window_live: torch.Tensor,
        mask_slots: torch.Tensor,
        logits_to_keep: int,
    ) -> torch.Tensor:
        """The forward over every row of the batch (finished rows feed dead mask slots at position 0) under the
        cache's own 4D mask; returns the logits of the rows still decoding."""
        rows, batch_size = self.cache.rows, self.cache.committed.shape[0]
        all_ids = input_ids.new_full((batch_size, input_ids.shape[1]), self.mask_id).index_copy(0, rows, input_ids)
        all_positions = position_ids.new_zeros(all_ids.shape).index_copy(0, rows, position_ids)
        all_slots = mask_slots.new_zeros((batch_size, mask_slots.shape[1])).index_copy(0, rows, mask_slots)
        attention_mask = self.cache.begin_forward(window_live)
        forward = self.compiled_call if self.compiled_call is not None and self.cache.prefilled else self.model
        logits = window_forward(
            forward, self.cache, all_ids, attention_mask, all_positions, logits_to_keep, all_slots,
            **self.attention_kwargs,
        )
        return logits.index_select(0, rows)  # a copy: a CUDA graph's output is overwritten by its next replay


def compiles(model: PreTrainedModel, generation_config: GenerationConfig) -> bool:
    """Compile on CUDA, or anywhere the caller passed a `compile_config`, unless `disable_compile`."""
    if generation_config.disable_compile:
        return False
    return model.device.type == "cuda" or generation_config.compile_config is not None
