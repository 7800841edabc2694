"""The gate: a LoRA delta added to the rows whose input token is the mask id, and to no other row.

In a WeDLM forward every observed token (prompt, committed tokens, drafts under verification) is fed before every
mask slot and attention is causal, so when only mask rows change, every observed token's hidden states, K/V and
next-token logits are the base model's, bit for bit. Lossless verification then compares each draft with the base
model's own argmax. The delta is computed for the mask rows alone (gathered, two small matmuls, scattered back
with the LoRA scaling folded into the scatter: four ops a layer), so a forward without a mask slot (an AR step, a
memory stream in training) skips the adapter's arithmetic altogether.
"""

import torch
import torch.nn.functional as F
from peft.tuners.lora.layer import LoraVariant

from .config import MERGE_REFUSED



class MaskRows:
    """Which rows (flattened batch x sequence) of the forward in progress hold the mask token.

    Found once per forward, from the input ids the embedding layer receives, and read by every gated layer: one
    `nonzero` per forward rather than one per layer. A forward fed `inputs_embeds` has no token ids, hence no mask
    rows: it runs on the base weights.
    """

    def __init__(self, mask_token_id: int):
        self.mask_token_id = mask_token_id
        self.index: torch.Tensor | None = None
        self.shape: torch.Size | None = None
        self.handles: list = []

    def install(self, model: torch.nn.Module) -> "MaskRows":
        """Watch `model`'s decoder (forgets the last forward's rows) and its input embeddings (finds this one's)."""
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
        self.handles = [
            decoder.register_forward_pre_hook(self._forget),
            model.get_input_embeddings().register_forward_pre_hook(self._find),
        ]
        return self

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _forget(self, module, args) -> None:
        self.index, self.shape = None, None

    def _find(self, module, args) -> None:
        input_ids = args[0]
        self.shape = input_ids.shape
        self.index = (input_ids.reshape(-1) == self.mask_token_id).nonzero().squeeze(1)

    def of(self, x: torch.Tensor) -> torch.Tensor | None:
        """The mask rows of `x` (batch x sequence x features, or tokens x features), or None when there are none."""
        if self.index is None or self.index.numel() == 0:
            return None
        if x.shape[:-1].numel() != self.shape.numel():  # batch x sequence, or the two flattened into one
            raise RuntimeError(
                f"a draft-only adapter layer got input of shape {tuple(x.shape)} in a forward whose input ids are "
                f"{tuple(self.shape)}: the gate needs one row per input token (mixed-adapter batches are not supported)"
            )
        return self.index


class DraftOnlyLora(LoraVariant):
    """PEFT's LoRA variant hook (`lora_variant`), used as PEFT's own DoRA is: same weights and file format, a
    forward that adds the low-rank delta at mask rows only, and merging refused."""

    def __init__(self, rows: MaskRows):
        self.rows = rows

    def supports_lora_conversion(self) -> bool:
        return False

    @staticmethod
    def init(module, adapter_name: str, **kwargs) -> None:
        """Nothing beyond plain LoRA's weights."""

    def forward(self, module, active_adapter: str, x: torch.Tensor, result: torch.Tensor, **kwargs) -> torch.Tensor:
        index = self.rows.of(x)
        if index is None:
            return result
        rows = x.reshape(-1, x.shape[-1]).index_select(0, index)
        dropout = module.lora_dropout[active_adapter]
        if not isinstance(dropout, torch.nn.Identity):
            rows = dropout(rows)
        lora_a, lora_b = module.lora_A[active_adapter], module.lora_B[active_adapter]
        delta = F.linear(F.linear(rows, lora_a.weight), lora_b.weight, lora_b.bias)
        flat = result.reshape(-1, result.shape[-1])
        return flat.index_add(0, index, delta.to(result.dtype), alpha=module.scaling[active_adapter]).view(result.shape)

    @staticmethod
    def merge_safe(module, active_adapter: str, orig_weight: torch.Tensor) -> torch.Tensor:
        raise ValueError(MERGE_REFUSED)

    @staticmethod
    def merge_unsafe(module, active_adapter: str, orig_weight: torch.Tensor) -> None:
        raise ValueError(MERGE_REFUSED)

    @staticmethod
    def unmerge(module, active_adapter: str, orig_weight: torch.Tensor) -> torch.Tensor:
        raise ValueError(MERGE_REFUSED)
