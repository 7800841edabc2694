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
mode only without a mask, because CUDA's masked kernels lack it. On the CPU the masked kernel has it, so an SDPA
model runs `WINDOW_SDPA`, an attention function registered with transformers' `AttentionInterface` (and
`AttentionMaskInterface`, as SDPA's) that is SDPA in every other case. It is chosen once per model
(`choose_window_attention`, at `enable` and when a WeDLM model is built), never switched per forward, so threads
decoding one model (WeDLM and AR side by side) never see each other's attention implementation.
"""

import inspect

import torch
from transformers import AttentionInterface, PreTrainedConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from .mask_slots import forward_with_mask_slots

WINDOW_SDPA = "wedlm_window_sdpa"
MASK_IMPLEMENTATIONS = ("sdpa", WINDOW_SDPA, "eager")
"""Attention implementations that take a prebuilt 4D mask: boolean (SDPA and the window attention) or additive
(eager)."""


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True = attend) as eager attention's additive one: 0 where it attends, the dtype's minimum
    elsewhere."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def window_sdpa_attention(module: torch.nn.Module, query, key, value, attention_mask, **kwargs):
    """SDPA with grouped-query K/V kept grouped under a prebuilt boolean 4D mask, on the CPU; transformers' own
    SDPA function in every other case."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (
        groups == 1
        or query.device.type != "cpu"
        or attention_mask is None
        or attention_mask.dtype != torch.bool
        or kwargs.get("position_bias") is not None
    ):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, scale=kwargs.get("scaling"), enable_gqa=True
    )
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(WINDOW_SDPA, window_sdpa_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(WINDOW_SDPA, sdpa_mask)


_DISPATCHES_BY_NAME: dict[type, bool] = {}


def dispatches_through_attention_interface(model: torch.nn.Module) -> bool:
    """Whether every attention module of `model` looks its function up by name in `ALL_ATTENTION_FUNCTIONS`.

    Some families (Falcon, for one) compare `_attn_implementation` with "sdpa" themselves and would take their
    eager path, with a boolean mask, under another name; those keep plain SDPA. Decided once per model class."""
    model_class = type(model)
    if model_class not in _DISPATCHES_BY_NAME:
        attention_classes = {type(m) for m in model.modules() if type(m).__name__.endswith("Attention")}
        _DISPATCHES_BY_NAME[model_class] = bool(attention_classes) and all(
            hasattr(inspect.getmodule(c), "ALL_ATTENTION_FUNCTIONS") for c in attention_classes
        )
    return _DISPATCHES_BY_NAME[model_class]


def choose_window_attention(model: torch.nn.Module) -> None:
    """Run an SDPA model's attention through `WINDOW_SDPA` from now on (transformers' `set_attn_implementation`);
    other implementations, and families that compare the name with "sdpa" themselves, stay as they are."""
    sdpa = getattr(model.config, "_attn_implementation", None) == "sdpa"
    if sdpa and dispatches_through_attention_interface(model):
        model.set_attn_implementation(WINDOW_SDPA)


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
        cache=cache,
        use_cache=True,
        logits_to_keep=logits_to_keep,
        **attention_kwargs,
    ).logits


def uses_flash_attention(config: PreTrainedConfig) -> bool:
    return "flash" in str(getattr(config, "_attn_implementation", "") or "")


def prebuilt_attention_mask(
    config: PreTrainedConfig, key_valid: torch.Tensor, query_length: int, dtype: torch.dtype
) -> torch.Tensor:
    """The attention mask of a forward whose `query_length` queries are the last columns of `key_valid` (batch,
    keys): each query sees the valid keys up to its own column. 4D (batch, 1, queries, keys) for SDPA (boolean)
    and eager attention (additive); the 2D key mask for every other implementation, which builds its own."""
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in MASK_IMPLEMENTATIONS:
        return key_valid.long()
    batch_size, key_length = key_valid.shape
    causal = torch.ones(query_length, key_length, dtype=torch.bool, device=key_valid.device).tril(
        key_length - query_length
    )
    mask = key_valid.view(batch_size, 1, 1, key_length) & causal
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
