"""One batch through `model.generate`: left-padded prompts in, one result per row out.

A result's `finish_reason` is "eos", "stop" (a stop string) or "length" (all its `max_new_tokens`): WeDLM
records it where the row ended (`WeDLMStats.finish_reasons`); an autoregressive row, whose `generate` records
none, is read off its tokens. Row statistics come from the WeDLM stats, which do not depend on the batch a row ran
in.
"""

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from ..generation.outputs import EOS, LENGTH, STOP, WeDLMStats
from ..continuous.padding import left_padded
from .plan import Batch
from .rows import PromptRow


def generate_batch(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch: Batch, generate_kwargs: dict
) -> tuple[list[tuple[int, dict]], int, int]:
    """One left-padded `generate` call; its `(index, result)` pairs, generated tokens and model forwards."""
    kwargs = {**generate_kwargs, **batch.overrides, "return_dict_in_generate": True}
    config = model.generation_config
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else config.pad_token_id
    eos_ids = eos_token_ids(tokenizer, config)
    if pad_id is None:
        pad_id = eos_ids[0] if eos_ids else 0
    longest = batch.longest
    input_ids, attention_mask = left_padded(batch.token_ids, pad_id)
    if kwargs.get("stop_strings"):
        kwargs["tokenizer"] = tokenizer
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids.to(model.device), attention_mask=attention_mask.to(model.device), **kwargs
        )
    new = output.sequences[:, longest:].tolist()
    stats = getattr(output, "wedlm_stats", None)
    max_new_tokens = kwargs.get("max_new_tokens", config.max_new_tokens)
    stop_strings = bool(kwargs.get("stop_strings"))
    results, total_tokens = [], 0
    for i, row in enumerate(batch.rows):
        length = stats.generated[i] if stats is not None else _ar_length(new[i], eos_ids, pad_id, stop_strings)
        tokens = new[i][:length]
        reason = stats.finish_reasons[i] if stats is not None else ar_finish_reason(tokens, eos_ids, max_new_tokens)
        results.append((row.index, result_entry(tokenizer, row, tokens, reason, len(batch.token_ids[i]), stats, i)))
        total_tokens += length
    forwards = stats.model_calls if stats is not None else len(new[0])
    return results, total_tokens, forwards


def result_entry(
    tokenizer: PreTrainedTokenizerBase,
    row: PromptRow,
    tokens: list[int],
    finish_reason: str,
    prompt_tokens: int,
    stats: WeDLMStats | None,
    position: int,
) -> dict:
    """A row's line of the output: its id, text, finish reason and statistics (WeDLM's at `position` of `stats`,
    the call's)."""
    row_stats = {"prompt_tokens": prompt_tokens, "tokens": len(tokens)}
    if stats is not None:
        row_stats["forwards"] = stats.forwards[position]
        row_stats["tokens_per_forward"] = round(stats.tokens_per_forward[position], 3)
        if stats.drafted is not None:
            row_stats["drafted"], row_stats["accepted"] = stats.drafted[position], stats.accepted[position]
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    return {"id": row.id, "continuation": text, "finish_reason": finish_reason, "stats": row_stats}


def eos_token_ids(tokenizer: PreTrainedTokenizerBase, config: GenerationConfig) -> list[int]:
    eos = config.eos_token_id if config.eos_token_id is not None else tokenizer.eos_token_id
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


def _ar_length(tokens: list[int], eos_ids: list[int], pad_id: int, stop_strings: bool) -> int:
    """Length of an autoregressive row: through its first EOS; after a stop string transformers pads the tail."""
    for position, token in enumerate(tokens):
        if token in eos_ids:
            return position + 1
    if stop_strings:
        while tokens and tokens[-1] == pad_id:
            tokens = tokens[:-1]
    return len(tokens)


def ar_finish_reason(tokens: list[int], eos_ids: list[int], max_new_tokens: int) -> str:
    """Why an autoregressive row ended: its EOS, its budget, else a stop string (nothing else ends it early)."""
    if tokens and tokens[-1] in eos_ids:
        return EOS
    return LENGTH if len(tokens) >= max_new_tokens else STOP
