"""Batch generation over a list or JSONL file of prompts, on one process or many (accelerate, torchrun)."""

from .generate import batch_generate, generate_in_rounds
from .rows import OVERRIDES, PromptRow, RowError, read_rows, rows_from_items

__all__ = ["OVERRIDES", "PromptRow", "RowError", "batch_generate", "generate_in_rounds", "read_rows", "rows_from_items"]
