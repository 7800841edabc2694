"""Lossless mode's per-row draft counters and mask check, and the one error a row's decoding can raise in it."""

from dataclasses import dataclass

import torch

from .window import PerRow


class MaskTokenPredicted(ValueError):
    """The model's greedy next token is the mask token in input rows `rows`: lossless cannot go on in those."""

    def __init__(self, rows: list[int]):
        self.rows = rows
        super().__init__("The model's greedy next token is the mask token; `wedlm_lossless=True` needs a model that "
                         "never emits `mask_token_id` as a next token (any WeDLM-trained checkpoint).")


@dataclass
class DraftState(PerRow):
    """Lossless mode's per-row state (first dimension: the running rows)."""

    drafted: torch.Tensor
    accepted: torch.Tensor
    corrected: torch.Tensor
    """Counters: drafts checked, drafts accepted, forwards that corrected a draft."""
    mask_predicted: torch.Tensor
    """A row whose next token was the mask id (reported at the next sync: lossless cannot go on)."""
