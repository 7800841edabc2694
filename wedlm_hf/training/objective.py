"""The WeDLM dual-stream masking objective (spec §6) as a data collator and a loss, usable with `Trainer`.

A training row is `[x0 ; xt]`: the clean *memory* stream x0 and the *prediction* stream xt, both at RoPE
positions 0..L-1. xt is cut into blocks of `block_size`; each block masks a random share of its tokens and is
reordered (observed first, masks last, each keeping its logical position). A mask at position p is trained to
predict the token at p, which is exactly what WeDLM decoding asks of the window slots after a committed prefix.
The attention pattern is the same for every row (it depends only on block boundaries and physical order), so it
is built once per length and passed as an explicit 4D additive mask; that also keeps transformers from reading
the non-monotonic position ids as packed sequences (spec §4).
"""

from dataclasses import dataclass, field
from functools import lru_cache

import torch
import torch.nn.functional as F
from transformers import Trainer

from ..generation.attention import additive_mask

IGNORE_INDEX = -100


@lru_cache(maxsize=8)
def dual_stream_visibility(length: int, block_size: int) -> torch.Tensor:
    """Boolean (2L, 2L) matrix: entry [q, k] is True when physical slot q may attend to physical slot k.

    Memory slot i sees memory slots <= i. Prediction slot L+s in block b sees the memory slots of earlier blocks
    (logical positions < b*block_size) and the prediction slots of its own block up to itself in physical order.
    """
    slots = torch.arange(length)
    block = slots // block_size
    visible = torch.zeros(2 * length, 2 * length, dtype=torch.bool)
    visible[:length, :length] = slots[None, :] <= slots[:, None]
    visible[length:, :length] = slots[None, :] < (block * block_size)[:, None]
    visible[length:, length:] = (block[None, :] == block[:, None]) & (slots[None, :] <= slots[:, None])
    return visible


def dual_stream_attention_mask(length: int, block_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive (1, 1, 2L, 2L) mask (0 where visible, dtype's minimum elsewhere): works for eager and SDPA."""
    visible = dual_stream_visibility(length, block_size)
    return additive_mask(visible, dtype)[None, None]


@dataclass
class DualStreamCollator:
    """Turns equal-length `input_ids` rows into dual-stream batches.

    Returns `input_ids`, `position_ids` (2L each), the 4D `attention_mask`, `labels` (next token on the memory
    stream, own-position token on masked prediction slots, `-100` elsewhere) and `loss_weights`, already scaled
    so that `dual_stream_loss` is the per-token masked-diffusion loss plus `ar_weight` times the per-token AR
    loss. Block b masks m_b of its n_b maskable tokens, m_b = ceil(k * n_b / B) with k ~ U{1..B}
    (g_b = m_b / n_b, weight 1/g_b). With probability `suffix_prob` the masks are the block's last m_b maskable
    tokens instead of a random subset: decoding fills windows left to right, so masks trailing a filled prefix are
    the case inference meets most.

    A feature may carry `maskable` (bool per token, default all true): only those tokens are ever masked and
    predicted, and only they are next-token targets of the AR loss. That is how SFT keeps the prompt observed, as
    decoding sees it, and how right padding carries no loss (padding sits after every real token, so causal
    attention never lets a real token see it).
    """

    mask_token_id: int
    block_size: int = 32
    ar_weight: float = 0.5
    suffix_prob: float = 0.5
    seed: int | None = None
    dtype: torch.dtype = torch.float32
    generator: torch.Generator = field(init=False, repr=False)

    def __post_init__(self):
        self.generator = torch.Generator()
        if self.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(self.seed)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        x0 = torch.stack([torch.as_tensor(f["input_ids"], dtype=torch.long) for f in features])
        batch, length = x0.shape
        maskable = torch.stack(
            [torch.as_tensor(f["maskable"], dtype=torch.bool) if "maskable" in f else torch.ones(length, dtype=torch.bool) for f in features]
        )
        order, masked, weight = self._sample_blocks(maskable)
        xt = torch.gather(x0, 1, order).masked_fill(masked, self.mask_token_id)

        positions = torch.arange(length).expand(batch, length)
        ar_target = torch.zeros_like(maskable)
        ar_target[:, :-1] = maskable[:, 1:]
        memory_labels = torch.full_like(x0, IGNORE_INDEX)
        memory_labels[:, :-1] = x0[:, 1:]
        memory_labels = memory_labels.masked_fill(~ar_target, IGNORE_INDEX)
        prediction_labels = torch.where(masked, torch.gather(x0, 1, order), IGNORE_INDEX)
        ar_count = ar_target.sum(dim=1, keepdim=True).clamp(min=1)
        memory_weights = torch.where(ar_target, self.ar_weight / ar_count, 0.0)
        prediction_weights = torch.where(masked, weight / maskable.sum(dim=1, keepdim=True).clamp(min=1), 0.0)
        return {
            "input_ids": torch.cat([x0, xt], dim=1),
            "position_ids": torch.cat([positions, order], dim=1),
            "attention_mask": dual_stream_attention_mask(length, self.block_size, self.dtype).expand(batch, -1, -1, -1),
            "labels": torch.cat([memory_labels, prediction_labels], dim=1),
            "loss_weights": torch.cat([memory_weights, prediction_weights], dim=1),
        }

    def _sample_blocks(self, maskable: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per row: physical->logical position map, mask flags (physical order) and each slot's 1/g weight."""
        batch, length = maskable.shape
        order = torch.empty(batch, length, dtype=torch.long)
        masked = torch.zeros(batch, length, dtype=torch.bool)
        weight = torch.zeros(batch, length)
        for start in range(0, length, self.block_size):
            size = min(self.block_size, length - start)
            can_mask = maskable[:, start : start + size]
            available = can_mask.sum(dim=1)
            draws = torch.randint(1, size + 1, (batch,), generator=self.generator)
            counts = torch.div(draws * available + size - 1, size, rounding_mode="floor")  # ceil(k * n_b / B)
            scores = torch.rand(batch, size, generator=self.generator)
            suffix = torch.rand(batch, generator=self.generator) < self.suffix_prob
            scores = torch.where(suffix[:, None], torch.arange(size, dtype=torch.float).expand(batch, size), scores)
            scores = scores.masked_fill(~can_mask, -1.0)  # below every maskable token's score: never masked
            rank = scores.argsort(dim=1).argsort(dim=1)  # 0 = least likely to be masked
            is_masked = rank >= (size - counts)[:, None]
            # observed first, masks last, logical order kept inside each group
            key = is_masked.long() * size + torch.arange(size)
            order[:, start : start + size] = start + key.argsort(dim=1)
            masked[:, start : start + size] = torch.arange(size) >= (size - counts)[:, None]
            weight[:, start : start + size] = (available / counts.clamp(min=1).float())[:, None]
        return order, masked, weight


def dual_stream_loss(
    logits: torch.Tensor, labels: torch.Tensor, loss_weights: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted cross-entropy of each slot's logits against its own label (no shift), averaged over rows.

    Returns the loss and its two parts (`mdm`: masked prediction stream, `ar`: memory-stream next token,
    unweighted by `ar_weight`) for logging.
    """
    batch, width = labels.shape
    length = width // 2
    per_slot = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
    ).view(batch, width)
    weighted = per_slot * loss_weights
    with torch.no_grad():
        memory_valid = labels[:, :length] != IGNORE_INDEX
        parts = {
            "mdm": weighted[:, length:].sum().item() / batch,
            "ar": (per_slot[:, :length].sum() / memory_valid.sum().clamp(min=1)).item(),
        }
    return weighted.sum() / batch, parts


MODEL_INPUTS = ("input_ids", "position_ids", "attention_mask")


def dual_stream_forward(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float], object]:
    """Forward a `DualStreamCollator` batch and return its loss, the loss parts and the model outputs."""
    outputs = model(**{key: batch[key] for key in MODEL_INPUTS}, use_cache=False)
    loss, parts = dual_stream_loss(outputs.logits, batch["labels"], batch["loss_weights"])
    return loss, parts, outputs


class WeDLMTrainer(Trainer):
    """`Trainer` whose loss is `dual_stream_loss` on batches from `DualStreamCollator`.

    The collator's extra keys (`labels`, `loss_weights`) are kept away from the model's forward. The loss is
    already a per-row mean (it ignores `num_items_in_batch`), so `Trainer` must divide it by the
    gradient-accumulation steps itself: hence `model_accepts_loss_kwargs = False`. Each log line also carries
    the two loss parts (`mdm`, `ar`, means since the previous log; `eval_mdm`, `eval_ar` in evaluation).
    `loss_forward` computes a batch's loss: the joint forward here, `draft_objective.draft_only_forward` for a
    draft-only adapter.
    """

    def __init__(self, *args, loss_forward=dual_stream_forward, **kwargs):
        super().__init__(*args, **kwargs)
        self.model_accepts_loss_kwargs = False
        self.loss_forward = loss_forward
        self._parts: dict[str, dict[str, list[float]]] = {"train": {}, "eval": {}}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, parts, outputs = self.loss_forward(model, inputs)
        split = self._parts["train" if model.training else "eval"]
        for name, value in parts.items():
            split.setdefault(name, []).append(value)
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        split, prefix = ("eval", "eval_") if "eval_loss" in logs else ("train", "")
        if split == "eval" or "loss" in logs:
            for name, values in self._parts[split].items():
                logs[prefix + name] = round(sum(values) / len(values), 4)
            self._parts[split] = {}
        super().log(logs, *args, **kwargs)
