"""The dynamic forward backend: `WeDLMCache` (the batch shrinks as rows finish, the cache grows by what each step
commits), each forward at the width of the longest running window under a prebuilt mask, FlashAttention's
sequence lengths, and the mask-free one-token forward of a single unpadded row."""

import torch
from transformers import PreTrainedModel

from .attention import (
    flash_sequence_lengths,
    prebuilt_attention_mask,
    uses_flash_attention,
    window_attention_kwargs,
    window_forward,
)
from .cache import WeDLMCache
from .window import RunningRow, Updates


class DynamicBackend:
    def __init__(self, model: PreTrainedModel, prompt_mask: torch.Tensor, prompt_padded: bool):
        self.model = model
        self.cache = WeDLMCache(key_mask=prompt_mask)
        self.all_keys_valid = prompt_mask.shape[0] == 1 and not prompt_padded and not uses_flash_attention(model.config)
        """One unpadded row: every cached key stays valid, so a one-token forward needs no mask, as in AR decoding
        (then transformers' SDPA keeps grouped-query K/V grouped; its mask function checks, with one host read as in
        its own AR step, that no mask is needed)."""
        self.attention_kwargs = window_attention_kwargs(model)

    def shape(self, fed: int, mask_columns: int) -> tuple[int, int]:
        """The width to feed and the mask columns in it: the longest running window's, as the sync read them."""
        return fed, mask_columns

    def sync_values(self, committed: torch.Tensor) -> list[torch.Tensor]:
        """The sizes `commit` needs, read in the step sync: the largest commit and the longest row after it."""
        return [committed.max(), (self.cache.valid_per_row + committed).max()]

    def commit(self, committed: torch.Tensor, values: list[int], columns: torch.Tensor | None = None) -> None:
        """Keep each row's first `committed` K/V of the last forward's window, at its fed `columns` if given
        (`values`: `sync_values`, read)."""
        self.cache.commit(committed, *values, columns)

    def select_rows(self, index: torch.Tensor, kept: list[RunningRow]) -> None:
        """Only running rows `kept` (`index` on the device) go on: every layer's K/V are index-selected."""
        self.cache.select_rows(index)

    def joined_rows(self, other: "DynamicBackend") -> Updates:
        """`other`'s rows appended (`WeDLMCache.joined`); joined into a batch with rows, they no longer qualify for
        the mask-free path."""
        all_keys_valid = other.all_keys_valid and self.cache.key_mask.shape[0] == 0
        return self.cache.joined(other.cache) + [(self, {"all_keys_valid": all_keys_valid})]

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        window_live: torch.Tensor,
        mask_slots: torch.Tensor,
        logits_to_keep: int,
        window_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The model's forward over the fed columns (`window_live`: the live window slots among them), under the
        step's prebuilt mask (`mask_slots`: which of the last columns are mask slots; `window_mask`: a tree's, among the
        fed columns); returns the logits of the last `logits_to_keep` columns."""
        model, past_length = self.model, self.cache.get_seq_length()
        attention_mask = None
        if input_ids.shape[1] > 1 or not self.all_keys_valid:
            attention_mask = prebuilt_attention_mask(
                model.config, self.cache.key_valid(window_live), input_ids.shape[1], model.dtype, window_mask
            )
        batch_size, fed = input_ids.shape
        kwargs = flash_sequence_lengths(model.config, batch_size, fed, past_length, input_ids.device)
        if attention_mask is not None:  # the keyword only matters under a mask, and costs a mask-free forward ~6%
            kwargs.update(self.attention_kwargs)
        return window_forward(
            model, self.cache, input_ids, attention_mask, position_ids, logits_to_keep, mask_slots, **kwargs
        )
