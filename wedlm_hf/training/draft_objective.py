"""The dual-stream objective for a draft-only adapter, paying only for what learns.

With the base frozen and the adapter acting at mask slots alone, the memory stream x0 is the base model's own
forward: it needs no autograd and no logits. It runs once under `no_grad` into a cache, and the prediction stream
xt attends to those K/V as it would inside the joint 2L forward (same 4D mask rows, same positions). Only masked
slots carry a loss, so only their hidden states go through the LM head (SmolLM2's 49k-row head is a large share of
its FLOPs). The AR loss is dropped: it would train nothing. The adapter acts at the slots the collator masked,
handed down as the decoder hands down its own (`generation.mask_slots`), so a mask token in the data is an observed
token here as in decoding. The loss equals `dual_stream_loss` of the joint forward with `ar_weight=0`
(tests/test_draft_adapter.py checks it).
"""

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from ..draft_adapter import unwrapped
from ..generation.mask_slots import forward_with_mask_positions
from ..generation.transformers_version import CACHE_KEYWORD
from .objective import IGNORE_INDEX


def draft_only_forward(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float], dict]:
    """Loss of a `DualStreamCollator` batch for a draft-only adapter: memory stream without autograd, masked slots
    alone through the head. Returns the loss, its parts (`mdm`) and no model outputs (an empty dict, which
    `Trainer`'s evaluation reads as no logits)."""
    causal_lm = unwrapped(model)
    decoder = causal_lm.get_decoder()
    input_ids, positions, mask = batch["input_ids"], batch["position_ids"], batch["attention_mask"]
    length = input_ids.shape[1] // 2
    cache = DynamicCache(config=causal_lm.config)
    with torch.no_grad():
        decoder(
            input_ids=input_ids[:, :length], position_ids=positions[:, :length],
            attention_mask=mask[:, :, :length, :length], use_cache=True, **{CACHE_KEYWORD: cache},
        )
    labels, weights = batch["labels"][:, length:], batch["loss_weights"][:, length:]
    masked = labels != IGNORE_INDEX  # the collator's mask slots: the only positions with a label
    hidden = forward_with_mask_positions(
        decoder, masked, input_ids=input_ids[:, length:], position_ids=positions[:, length:],
        attention_mask=mask[:, :, length:, :], use_cache=True, **{CACHE_KEYWORD: cache},
    ).last_hidden_state
    logits = causal_lm.get_output_embeddings()(hidden[masked])
    softcap = getattr(causal_lm.config.get_text_config(), "final_logit_softcapping", None)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    per_slot = F.cross_entropy(logits.float(), labels[masked], reduction="none")
    loss = (per_slot * weights[masked]).sum() / input_ids.shape[0]
    return loss, {"mdm": loss.item()}, {}
