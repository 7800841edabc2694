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

from .attention import WindowAttention
from .decoding import WindowDecoder
from .lossless import LosslessDecoder
from .settings import WeDLMSettings

MASK_IMPLEMENTATIONS = ("sdpa", "eager")
"""Attention implementations that take a 4D mask: boolean (sdpa) or additive (eager)."""


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

    Keeps the interface the decoder's step sync uses on `WeDLMCache` (`valid_per_row`, `commit`, `select_rows`) and
    builds each forward's 4D mask itself (`attention_mask`), but rows never leave: `rows` lists the ones still
    decoding, and the masks and writes cover the whole batch.
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

    def attention_mask(self, window_live: torch.Tensor) -> torch.Tensor:
        """The (batch, 1, fed, columns) mask of the next forward, whose windows' live slots are `window_live` for
        the rows still decoding; sets where that forward writes. The first forward also feeds the prompt."""
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
            mask = torch.zeros(mask.shape, dtype=self.mask_dtype, device=mask.device).masked_fill(
                ~mask, torch.finfo(self.mask_dtype).min
            )
        return mask[:, None]

    @property
    def valid_per_row(self) -> torch.Tensor:
        """Valid K/V columns of each row still decoding (prompt tokens and committed ones), as `WeDLMCache` has."""
        return (self.prompt_tokens + self.committed)[self.rows]

    def commit(self, num_committed: torch.Tensor, *sizes: int) -> None:
        """After a forward, keep each live row's first `num_committed` window slots (the rest get overwritten).
        The sizes `WeDLMCache.commit` crops with do not apply: nothing is cropped here."""
        self.committed.index_add_(0, self.rows, num_committed)
        self.prefilled = True

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep decoding only `rows` (indices into the rows still decoding); the others stay in as dead rows."""
        self.rows = self.rows[rows]


class StaticShapes:
    """Mixed into a decoder: fixed-width feeds over the whole batch and a `WindowStaticCache`."""

    def __init__(
        self,
        model: PreTrainedModel,
        input_ids: torch.LongTensor,
        prompt_mask: torch.Tensor,
        settings: WeDLMSettings,
        generation_config: GenerationConfig,
        *args,
        **kwargs,
    ):
        implementation = model.config._attn_implementation
        if implementation not in MASK_IMPLEMENTATIONS:
            raise ValueError(
                f"`wedlm_static=True` feeds a 4D attention mask, which attn_implementation={implementation!r} does "
                f"not take; load the model with attn_implementation='sdpa' (or 'eager'), or use wedlm_static=False."
            )
        super().__init__(model, input_ids, prompt_mask, settings, generation_config, *args, **kwargs)
        mask_dtype = model.dtype if implementation == "eager" else None
        # as in transformers' static cache, `max_cache_len` sizes the cache for the longest call, so later calls
        # with other prompt lengths reuse the compiled step
        needed = input_ids.shape[1] + self.max_new_tokens + self.width
        max_cache_len = max(needed, generation_config.max_cache_len or 0)
        self.cache = WindowStaticCache(model.config, prompt_mask, max_cache_len, mask_dtype)
        self.compiled_call = None
        if compiles(model, generation_config):
            self.compiled_call = model.get_compiled_call(generation_config.compile_config)

    def _begin_step(self, *args, **kwargs):
        """The step's sync as usual, but every forward feeds (and keeps the logits of) the full width."""
        step = super()._begin_step(*args, **kwargs)
        if step is None:
            return None
        _, _, row_tensors, checks = step
        return self.width, self.width, row_tensors, checks

    def _forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, window_live: torch.Tensor, logits_to_keep: int
    ) -> torch.Tensor:
        """The forward over every row of the batch (finished rows feed dead mask slots at position 0) under the
        cache's own 4D mask; returns the logits of the rows still decoding."""
        rows, batch_size = self.cache.rows, self.cache.committed.shape[0]
        all_ids = input_ids.new_full((batch_size, input_ids.shape[1]), self.mask_id).index_copy(0, rows, input_ids)
        all_positions = position_ids.new_zeros(all_ids.shape).index_copy(0, rows, position_ids)
        attention_mask = self.cache.attention_mask(window_live)
        forward = self.compiled_call if self.compiled_call is not None and self.cache.prefilled else self.model
        with WindowAttention(self.model):
            logits = forward(
                input_ids=all_ids,
                attention_mask=attention_mask,
                position_ids=all_positions,
                cache=self.cache,
                use_cache=True,
                logits_to_keep=logits_to_keep,
            ).logits
        return logits.index_select(0, rows)  # a copy: a CUDA graph's output is overwritten by its next replay


def compiles(model: PreTrainedModel, generation_config: GenerationConfig) -> bool:
    """Compile on CUDA, or anywhere the caller passed a `compile_config`, unless `disable_compile`."""
    if generation_config.disable_compile:
        return False
    return model.device.type == "cuda" or generation_config.compile_config is not None


class StaticWindowDecoder(StaticShapes, WindowDecoder):
    pass


class StaticLosslessDecoder(StaticShapes, LosslessDecoder):
    pass


def static_decoder(decoder_class: type[WindowDecoder]) -> type[WindowDecoder]:
    """The static-shape variant of `decoder_class`."""
    return {WindowDecoder: StaticWindowDecoder, LosslessDecoder: StaticLosslessDecoder}[decoder_class]
