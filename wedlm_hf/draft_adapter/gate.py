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
memory stream in training) skips the adapter altogether: a gated layer whose adapters are all draft-only calls its
base layer alone (`forward`, set on each gated layer), without PEFT's per-call bookkeeping (210 layers of SmolLM2-135M:
its one-token forward took 1.17x the base model's before, 1.04x after, on a 2-vCPU AMD EPYC, in noisy runs). Under `torch.compile` each gated layer is a
graph break (dynamo does not trace `ContextVar.get`), as the token test's `nonzero` was.
"""

import types

import torch
import torch.nn.functional as F
from peft.tuners.lora.layer import LoraVariant

from ..generation.mask_slots import MASK_SLOTS
from .config import MERGE_REFUSED


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
    layer is draft-only (each delta is zero there); PEFT's own forward otherwise."""
    if MASK_SLOTS.get() is None and not kwargs and all(
        isinstance(module.lora_variant.get(name), DraftOnlyLora) for name in module.lora_A
    ):
        return module.base_layer(x, *args)
    return type(module).forward(module, x, *args, **kwargs)


def skip_without_mask_slots(module: torch.nn.Module) -> None:
    """Set `forward` on gated layer `module` (a bound method, so a deep copy of the model binds its own copy)."""
    module.forward = types.MethodType(forward, module)
