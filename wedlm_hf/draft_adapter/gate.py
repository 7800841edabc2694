"""The gate: a LoRA delta added at the slots the decoder placed as masks, and at no other position.

In a WeDLM forward every observed token (prompt, committed tokens, drafts under verification) is fed before every
mask slot and attention is causal, so when only mask slots change, every observed token's hidden states, K/V and
next-token logits are the base model's, bit for bit. Lossless verification then compares each draft with the base
model's own argmax.

The gate is decided by the decoder, not by the token: the decoder (and the draft-only training objective) hands the
forward's mask slots down in `generation.mask_slots.MASK_SLOTS`, a context variable, because a token test would
also fire on a mask token the user typed in the prompt, and a hook or attribute on the model would be shared by
every thread decoding it. The decoder's mask slots are a suffix of each row's feed, so the delta is computed on a static
slice of the last positions (two small matmuls, then one fused multiply-add that zeroes the rows' non-mask
positions): its cost follows the mask slots, with no host read. Training names its slots by position; their rows
are gathered and the delta scattered back. A forward without mask slots (plain `generate()`, an AR step, a
memory stream in training) skips the adapter altogether: a gated layer whose adapters are all draft-only calls
its base layer alone (`forward`, set on each gated layer), without PEFT's per-call bookkeeping (210 layers of
SmolLM2-135M: its one-token forward took 1.17x the base model's under PEFT's forward, 1.045x with the gate
testing each adapter's variant per call, 1.023x with the layer's draft-only adapter names kept on it and a plain
linear base applied directly; 2-vCPU AMD EPYC, 2026-12-07, medians of 280 interleaved). Under `torch.compile` each
gated layer is a graph break (dynamo does not trace `ContextVar.get`), as the token test's `nonzero` was.
"""

import types

import torch
import torch.nn.functional as F
from peft.tuners.lora.layer import LoraVariant

from ..generation.mask_slots import MASK_SLOTS
from .config import MERGE_REFUSED

LINEAR = torch.nn.Linear


class DraftOnlyLora(LoraVariant):
    """PEFT's LoRA variant hook (`lora_variant`), used as PEFT's own DoRA is: same weights and file format, a
    forward that adds the low-rank delta at the forward's mask slots only, and merging refused."""

    def supports_lora_conversion(self) -> bool:
        return False

    @staticmethod
    def init(module, adapter_name: str, **kwargs) -> None:
        """Nothing beyond plain LoRA's weights."""

    def forward(self, module, active_adapter: str, x: torch.Tensor, result: torch.Tensor, **kwargs) -> torch.Tensor:
        slots = MASK_SLOTS.get()
        if slots is None:
            return result
        rows, length = slots.rows, slots.length
        if x.shape[:-1].numel() != rows * length:  # batch x sequence, or the two flattened into one
            raise RuntimeError(
                f"a draft-only adapter layer got input of shape {tuple(x.shape)} in a forward of {rows} rows of "
                f"{length} positions: the gate needs one row per input position (mixed-adapter batches and routed "
                "experts are not supported)"
            )
        lora_a, lora_b = module.lora_A[active_adapter], module.lora_B[active_adapter]
        dropout, scaling = module.lora_dropout[active_adapter], module.scaling[active_adapter]

        def delta(inputs: torch.Tensor) -> torch.Tensor:
            return F.linear(F.linear(dropout(inputs), lora_a.weight), lora_b.weight, lora_b.bias)

        if slots.index is not None:  # training's blocks: gathered, scattered back
            rows_in = x.reshape(-1, x.shape[-1]).index_select(0, slots.index)
            flat = result.reshape(-1, result.shape[-1])
            return flat.index_add(0, slots.index, delta(rows_in).to(result.dtype), alpha=scaling).view(result.shape)
        columns = slots.suffix.shape[1]
        tail = x.reshape(rows, length, x.shape[-1])[:, length - columns :]
        target = result.view(rows, length, result.shape[-1])[:, length - columns :]
        target.addcmul_(delta(tail), slots.suffix, value=scaling)
        return result

    @staticmethod
    def merge_safe(module, active_adapter: str, orig_weight: torch.Tensor) -> torch.Tensor:
        raise ValueError(MERGE_REFUSED)

    @staticmethod
    def merge_unsafe(module, active_adapter: str, orig_weight: torch.Tensor) -> None:
        raise ValueError(MERGE_REFUSED)

    @staticmethod
    def unmerge(module, active_adapter: str, orig_weight: torch.Tensor) -> torch.Tensor:
        raise ValueError(MERGE_REFUSED)


def forward(module, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """A gated layer's forward: its base layer alone in a forward without mask slots, where every adapter of the
    layer is draft-only (each delta is zero there); PEFT's own forward otherwise. A base layer that is a plain
    `nn.Linear` with no hooks is applied as `F.linear`: one module call fewer per layer and forward. (Submodules are
    read from `_modules`: an attribute lookup through PEFT's layer costs about 1 us, which 210 layers would pay.)"""
    layers = module._modules
    if MASK_SLOTS.get() is None and not kwargs and layers["lora_A"]._modules.keys() <= module.draft_only:
        base = layers["base_layer"]
        if type(base) is LINEAR and not (base._forward_pre_hooks or base._forward_hooks):
            return F.linear(x, base.weight, base.bias)
        return base(x, *args)
    return type(module).forward(module, x, *args, **kwargs)


def gate(module: torch.nn.Module, adapter: str) -> None:
    """Make `adapter` of PEFT LoRA layer `module` draft-only, and set `forward` on the layer (a bound method, so a
    deep copy of the model binds its own copy); `draft_only` names the layer's draft-only adapters, which a layer
    whose adapters are all among them skips where a forward has no mask slot (an adapter added later that is not
    draft-only makes the layer run PEFT's forward)."""
    module.lora_variant[adapter] = DraftOnlyLora()
    module.draft_only = getattr(module, "draft_only", frozenset()) | {adapter}
    module.forward = types.MethodType(forward, module)
