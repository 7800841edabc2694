"""`batch_generate`: many prompts through `model.generate` in length-bucketed batches, on one or many processes.

Under `accelerate launch` each round hands one batch to each process (`PartialState.split_between_processes`) and
`gather_object` brings the round's results to every process, so the main process can write them while the
others go on. A tensor-parallel model (`tp_size` set) is one model spread over all processes: every process runs
every batch instead.
"""

import copy
import time
from contextlib import nullcontext
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..generation import WeDLMSettings
from .plan import Batch, encode, group_key, plan_batches
from .rows import PromptRow, RowError, rows_from_items

RESULT_KEYS = ("id", "continuation", "finish_reason", "stats")


def batch_generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: Iterable[dict | str],
    *,
    batch_size: int = 8,
    max_batch_tokens: int | None = None,
    progress: bool = False,
    **generate_kwargs,
) -> list[dict]:
    """Generate a continuation for every row and return one result per row, in input order.

    A row is a prompt string or a dict `{"id"?, "prompt" | "messages", <override>...}` (overrides: see
    `wedlm_hf.batch.rows.OVERRIDES`); `generate_kwargs` apply to every row a row does not override. A result is
    `{"id", "continuation", "finish_reason": "stop" | "length", "stats"}`. Under `accelerate launch` the rows are
    split across the processes and every process gets all the results.
    """
    rows = rows_from_items(rows)
    results = [None] * len(rows)
    for finished, _ in generate_in_rounds(
        model, tokenizer, rows, batch_size=batch_size, max_batch_tokens=max_batch_tokens, progress=progress,
        **generate_kwargs,
    ):
        for index, result in finished:
            results[index] = result
    return results


def generate_in_rounds(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[PromptRow],
    *,
    batch_size: int = 8,
    max_batch_tokens: int | None = None,
    progress: bool = False,
    **generate_kwargs,
) -> Iterator["Round"]:
    """Yield the results round by round (one batch per process per round), on every process."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"`batch_size` must be an integer >= 1, got {batch_size!r}.")
    if max_batch_tokens is not None and (not isinstance(max_batch_tokens, int) or max_batch_tokens < 1):
        raise ValueError(f"`max_batch_tokens` must be an integer >= 1 or None, got {max_batch_tokens!r}.")
    token_ids = [encode(tokenizer, row) for row in rows]
    new_tokens = {}
    for row in rows:  # one check per distinct override set, before anything is generated
        key = group_key(row.overrides)
        if key not in new_tokens:
            new_tokens[key] = _check_settings(model, row, {**generate_kwargs, **row.overrides})
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    for row, ids in zip(rows, token_ids):
        if limit is not None and len(ids) + new_tokens[group_key(row.overrides)] > limit:
            raise RowError(
                f"{row.where}: {len(ids)} prompt tokens plus max_new_tokens={new_tokens[group_key(row.overrides)]} "
                f"exceed the model's max_position_embeddings ({limit}); shorten the prompt or lower max_new_tokens."
            )
    batches = plan_batches(rows, token_ids, batch_size, max_batch_tokens, new_tokens)

    state = process_state()
    split = state.num_processes > 1 and getattr(model, "tp_size", None) is None
    per_round = state.num_processes if split else 1
    bar = tqdm(total=len(rows), unit="row", disable=not (progress and state.is_main_process), dynamic_ncols=True)
    start, tokens, forwards = time.perf_counter(), 0, 0
    for first in range(0, len(batches), per_round):
        in_round = batches[first : first + per_round]
        with state.split_between_processes(in_round) if split else nullcontext(in_round) as mine:
            finished, work = [], [Work(state.process_index, 0, 0, 0)]
            for batch in mine:
                batch_results, batch_tokens, batch_forwards = generate_batch(model, tokenizer, batch, generate_kwargs)
                finished += batch_results
                work = [Work(state.process_index, len(batch_results), batch_tokens, batch_forwards)]
        if split:
            finished, work = gather_object(finished), gather_object(work)
        tokens += sum(w.tokens for w in work)
        forwards += sum(w.forwards for w in work)
        bar.update(len(finished))
        bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - start):.1f}", tok_fwd=f"{tokens / max(forwards, 1):.2f}")
        yield Round(finished, work)
    bar.close()


def process_state() -> PartialState:
    """accelerate's view of the launch (`accelerate launch`, `torchrun` or a plain process).

    `PartialState` treats processes on a machine without an accelerator as one process each unless told `cpu=True`;
    then they join one gloo group. An already initialised state (a user's `Accelerator`) is returned unchanged.
    """
    has_accelerator = torch.accelerator.is_available() if hasattr(torch, "accelerator") else torch.cuda.is_available()
    return PartialState(cpu=not has_accelerator)


class Work(NamedTuple):
    """What one process did in a round (model forwards: batched calls, each counted once)."""

    process: int
    rows: int
    tokens: int
    forwards: int


class Round(NamedTuple):
    results: list[tuple[int, dict]]
    """`(row index, result)` of every row finished in the round, on all processes."""
    work: list[Work]


def _check_settings(model: PreTrainedModel, row: PromptRow, kwargs: dict) -> int:
    """Fail on a bad setting before any row is generated, naming the first row that uses it; return max_new_tokens."""
    config = copy.deepcopy(model.generation_config)
    wedlm = {key: kwargs[key] for key in kwargs if key.startswith("wedlm_") or key == "mask_token_id"}
    plain = {key: value for key, value in kwargs.items() if key not in wedlm and key not in ("decoding", "tokenizer")}
    try:
        config.update(**plain)
        config.validate(strict=True)
        if kwargs.get("decoding", getattr(config, "decoding", None)) == "wedlm":
            WeDLMSettings.resolve(
                config, model.config, model.config.get_text_config().vocab_size,
                **{key.removeprefix("wedlm_"): value for key, value in wedlm.items()},
            )
    except (ValueError, TypeError) as error:  # transformers' message spans lines: keep the ones naming the flag
        lines = [line.strip(" -") for line in str(error).splitlines() if line.strip() and "pretrained model" not in line]
        raise RowError(f"{row.where}: {' '.join(lines)}") from None
    if config.max_new_tokens is None:
        raise RowError(f"{row.where}: set `max_new_tokens` (for every row, or on this one).")
    return config.max_new_tokens


def generate_batch(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch: Batch, generate_kwargs: dict
) -> tuple[list[tuple[int, dict]], int, int]:
    """One left-padded `generate` call; its `(index, result)` pairs, generated tokens and model forwards."""
    kwargs = {**generate_kwargs, **batch.overrides, "return_dict_in_generate": True}
    config = model.generation_config
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else config.pad_token_id
    eos_ids = _eos_ids(tokenizer, config)
    if pad_id is None:
        pad_id = eos_ids[0] if eos_ids else 0
    longest = batch.longest
    input_ids = torch.full((len(batch.rows), longest), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, ids in enumerate(batch.token_ids):
        input_ids[i, longest - len(ids) :] = torch.tensor(ids)
        attention_mask[i, longest - len(ids) :] = 1
    if kwargs.get("stop_strings"):
        kwargs["tokenizer"] = tokenizer
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids.to(model.device), attention_mask=attention_mask.to(model.device), **kwargs
        )
    new = output.sequences[:, longest:].tolist()
    stats = getattr(output, "wedlm_stats", None)
    max_new_tokens = kwargs.get("max_new_tokens", config.max_new_tokens)
    stop_strings = kwargs.get("stop_strings") or []
    stop_strings = [stop_strings] if isinstance(stop_strings, str) else stop_strings
    results, total_tokens = [], 0
    for i, row in enumerate(batch.rows):
        length = stats.generated[i] if stats is not None else _ar_length(new[i], eos_ids, pad_id, bool(stop_strings))
        tokens = new[i][:length]
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        stopped = length < max_new_tokens or (tokens and tokens[-1] in eos_ids) or any(
            tokenizer.decode(tokens).endswith(s) for s in stop_strings
        )
        row_stats = {"prompt_tokens": len(batch.token_ids[i]), "tokens": length}
        if stats is not None:
            row_stats["forwards"] = stats.forwards[i]
            row_stats["tokens_per_forward"] = round(stats.tokens_per_forward[i], 3)
            if stats.drafted is not None:
                row_stats["drafted"], row_stats["accepted"] = stats.drafted[i], stats.accepted[i]
        result = {"id": row.id, "continuation": text, "finish_reason": "stop" if stopped else "length", "stats": row_stats}
        results.append((row.index, result))
        total_tokens += length
    forwards = stats.model_calls if stats is not None else len(new[0])
    return results, total_tokens, forwards


def _eos_ids(tokenizer: PreTrainedTokenizerBase, config) -> list[int]:
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
