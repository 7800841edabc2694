"""Attention inputs that keep a reordered WeDLM window one sequence.

transformers infers *packed sequences* from non-monotonic `position_ids` when it gets no 2D mask and no cache
(masking_utils) and, on FlashAttention, whenever a batch of one arrives without a mask. A WeDLM window's RoPE
positions are deliberately non-monotonic, so every decoding forward carries its cache (and a mask wherever a key
is invalid or the query is wider than one token), plus explicit `cu_seq_lens_*` for FlashAttention (whose mask
builder drops an all-ones mask). Model classes are left alone: without mask or cache, packing is what a caller
means (padding-free training batches).

A window forward's mask is prebuilt here in the 4D form the SDPA and eager attention functions take: transformers'
`create_causal_mask` returns a 4D mask as it is, so no mask is rebuilt per forward (a query longer than one token
over a cache otherwise always takes the full mask-building path, with a host sync in it).

With a mask, transformers' SDPA function copies K/V per query head (`repeat_kv`): it enables SDPA's grouped-query
mode only without a mask, because CUDA's masked kernels lack it. On the CPU the masked kernel has it, so window
forwards pass `WINDOW_ATTENTION=True` down to their attention calls, and the SDPA function registered here with
transformers' `AttentionInterface` (the one registered before it, unless that keyword is set) keeps K/V grouped.
The keyword travels with each call, so the model's `attn_implementation` stays what its user asked for, and
threads decoding one model (WeDLM and AR side by side) never see each other's attention.
"""

import inspect

import torch
from transformers import AttentionInterface, PreTrainedConfig
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .mask_slots import forward_with_mask_slots
from .transformers_version import CACHE_KEYWORD

WINDOW_ATTENTION = "wedlm_window_attention"
"""The keyword a window forward passes down to the model's attention calls (`window_attention_kwargs`)."""
MASK_IMPLEMENTATIONS = ("sdpa", "eager")
"""Attention implementations that take a prebuilt 4D mask: boolean (SDPA) or additive (eager)."""


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True = attend) as eager attention's additive one: 0 where it attends, the dtype's minimum
    elsewhere."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


_registered_sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]


def sdpa_attention(module: torch.nn.Module, query, key, value, attention_mask, **kwargs):
    """The SDPA function registered before this one (transformers' own, unless replaced), except in a window
    forward (`WINDOW_ATTENTION`) on the CPU under a boolean mask: there SDPA keeps grouped-query K/V grouped."""
    window = kwargs.pop(WINDOW_ATTENTION, False)
    if (
        not window
        or getattr(module, "num_key_value_groups", 1) == 1
        or query.device.type != "cpu"
        or attention_mask is None
        or attention_mask.dtype != torch.bool
        or kwargs.get("position_bias") is not None
    ):
        return _registered_sdpa(module, query, key, value, attention_mask, **kwargs)
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, scale=kwargs.get("scaling"), enable_gqa=True
    )
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register("sdpa", sdpa_attention)


_DISPATCHES_BY_NAME: dict[type, bool] = {}


def dispatches_through_attention_interface(model: torch.nn.Module) -> bool:
    """Whether every attention module of `model` looks its function up by name in `ALL_ATTENTION_FUNCTIONS`.

    Some families (Falcon, for one) compare `_attn_implementation` with "sdpa" themselves and never call the
    registered function; those get no `WINDOW_ATTENTION` keyword. Decided once per model class."""
    model_class = type(model)
    if model_class not in _DISPATCHES_BY_NAME:
        attention_classes = {type(m) for m in model.modules() if type(m).__name__.endswith("Attention")}
        _DISPATCHES_BY_NAME[model_class] = bool(attention_classes) and all(
            hasattr(inspect.getmodule(c), "ALL_ATTENTION_FUNCTIONS") for c in attention_classes
        )
    return _DISPATCHES_BY_NAME[model_class]


def window_attention_kwargs(model: torch.nn.Module) -> dict:
    """The keyword that makes an SDPA model's window forwards keep grouped K/V grouped (`sdpa_attention`); none
    for other implementations and for families that do not dispatch through `AttentionInterface`."""
    sdpa = getattr(model.config, "_attn_implementation", None) == "sdpa"
    return {WINDOW_ATTENTION: True} if sdpa and dispatches_through_attention_interface(model) else {}


def window_forward(
    call, cache, input_ids: torch.Tensor, attention_mask, position_ids: torch.Tensor, logits_to_keep: int,
    mask_slots: torch.Tensor, **attention_kwargs,
) -> torch.Tensor:
    """The logits of one window forward through `call` (the model, or its compiled call) into `cache`, its last
    `mask_slots.shape[1]` columns marked per row as mask slots or not (`mask_slots.forward_with_mask_slots`)."""
    return forward_with_mask_slots(
        call,
        mask_slots,
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        logits_to_keep=logits_to_keep,
        **{CACHE_KEYWORD: cache},
        **attention_kwargs,
    ).logits


def uses_flash_attention(config: PreTrainedConfig) -> bool:
    return "flash" in str(getattr(config, "_attn_implementation", "") or "")


def prebuilt_attention_mask(
    config: PreTrainedConfig, key_valid: torch.Tensor, query_length: int, dtype: torch.dtype,
    window_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The attention mask of a forward whose `query_length` queries are the last columns of `key_valid` (batch,
    keys): each query sees the valid keys up to its own column, or, among the queries' own columns, those
    `window_mask` (batch, queries, queries) gives it (a tree). 4D (batch, 1, queries, keys) for SDPA (boolean)
    and eager attention (additive); the 2D key mask for every other implementation, which builds its own (and
    gets no tree: `tree.py`)."""
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in MASK_IMPLEMENTATIONS:
        return key_valid.long()
    batch_size, key_length = key_valid.shape
    mask = key_valid.view(batch_size, 1, 1, key_length)
    if window_mask is not None:
        past = window_mask.new_ones((batch_size, query_length, key_length - query_length))
        mask = mask & torch.cat([past, window_mask], dim=2)[:, None]
    elif query_length > 1:  # (one query, the last column, sees every valid key: no order to apply)
        mask = mask & torch.ones(query_length, key_length, dtype=torch.bool, device=key_valid.device).tril(
            key_length - query_length
        )
    return additive_mask(mask, dtype) if implementation == "eager" else mask


def flash_sequence_lengths(
    config: PreTrainedConfig, batch_size: int, query_length: int, past_length: int, device: torch.device
) -> dict:
    """`cu_seq_lens_*` / `max_length_*` describing unpadded rows, so FlashAttention never infers packing."""
    if not uses_flash_attention(config):
        return {}
    key_length = past_length + query_length
    steps = torch.arange(batch_size + 1, dtype=torch.int32, device=device)
    return {
        "cu_seq_lens_q": steps * query_length,
        "cu_seq_lens_k": steps * key_length,
        "max_length_q": query_length,
        "max_length_k": key_length,
    }
