"""Batch jobs on the continuous-batching engine (wedlm_hf/continuous): every row of a process is a request of one
scheduler, so a row that ends frees its place for the next at once (no batch waits for its longest row, no
padding to a batch's longest prompt), and rows with different budgets, stop strings or sampling share a batch.

A request owns its `max_new_tokens`, `stop_strings` and sampling (`do_sample`, `temperature`, `top_k`, `top_p`,
penalties); the WeDLM settings are the scheduler's, so rows that override those run as a group of their own, one
group after another. Under `accelerate launch` each process runs its own engine over its share of the rows, and
the processes meet once per step to gather what ended (one `gather_object` call each, so every process makes the
same number of calls until none has work left).
"""

import copy
from collections.abc import Iterator
from contextlib import nullcontext

from accelerate import PartialState
from accelerate.utils import gather_object
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from ..continuous import GenerationRequest, WeDLMScheduler
from ..generation.sampling import SamplingParams
from .padded import result_entry
from .plan import group_key
from .rounds import Round, Work
from .rows import PromptRow

PER_REQUEST = ("max_new_tokens", "stop_strings", "do_sample", "temperature", "top_k", "top_p", "min_p",
               "repetition_penalty")
"""Generation keywords a request of the engine carries for itself; any other override makes a group of its own."""


def runs_on_engine(model: PreTrainedModel, generate_kwargs: dict) -> bool:
    """Whether a job decodes with WeDLM on the engine: WeDLM decoding of the whole model on each process (not
    tensor-parallel, where every process runs every batch), without fixed shapes or per-token scores."""
    config = model.generation_config
    decoding = generate_kwargs.get("decoding", getattr(config, "decoding", None))
    fixed_or_scores = any(generate_kwargs.get(name) for name in ("wedlm_static", "output_scores", "output_logits"))
    return decoding == "wedlm" and getattr(model, "tp_size", None) is None and not fixed_or_scores


def engine_rounds(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[PromptRow],
    token_ids: list[list[int]],
    batch_size: int,
    max_padded_tokens: int | None,
    generate_kwargs: dict,
    state: PartialState,
) -> Iterator[Round]:
    """Per step, on every process: the `(row index, result)` pairs that ended on any process, and what each
    process did in it."""
    positions = list(range(len(rows)))
    with state.split_between_processes(positions) if state.num_processes > 1 else nullcontext(positions) as mine:
        steps = _decode_groups(model, tokenizer, [rows[p] for p in mine], [token_ids[p] for p in mine], batch_size,
                               max_padded_tokens, generate_kwargs)
        while True:
            finished, tokens, forwards = next(steps, ([], 0, 0))
            work = [Work(state.process_index, len(finished), tokens, forwards)]
            if state.num_processes > 1:
                finished, work = gather_object(finished), gather_object(work)
            if not any(w.forwards for w in work):  # no process had a step left
                return
            yield Round(finished, work)


def _decode_groups(model, tokenizer, rows, token_ids, batch_size, max_batch_tokens, generate_kwargs):
    """Each group of rows sharing their non-request overrides through a scheduler of its own; per step, the
    results that ended, the tokens committed and the forwards (1)."""
    groups: dict[str, list[int]] = {}
    for position, row in enumerate(rows):
        shared = {key: value for key, value in row.overrides.items() if key not in PER_REQUEST}
        groups.setdefault(group_key(shared), []).append(position)
    for positions in groups.values():
        shared = {key: value for key, value in rows[positions[0]].overrides.items() if key not in PER_REQUEST}
        config = _config(model, {**generate_kwargs, **shared})
        scheduler = WeDLMScheduler(
            model, config, max_batch_size=batch_size, max_batch_tokens=max_batch_tokens, tokenizer=tokenizer
        )
        by_id = {}
        for position in positions:
            row, request = rows[position], _request(config, rows[position], token_ids[position], generate_kwargs)
            scheduler.add(request)
            by_id[request.request_id] = (row, len(token_ids[position]))
        while scheduler.has_work():
            finished, tokens = [], 0
            for update in scheduler.step():
                tokens += len(update.new_tokens)
                if update.finished:
                    finished.append(_result(tokenizer, *by_id[update.request_id], update.result))
            yield finished, tokens, 1


def _config(model: PreTrainedModel, kwargs: dict) -> GenerationConfig:
    """The scheduler's generation config: the model's, updated with the job's and the group's shared settings."""
    config = copy.deepcopy(model.generation_config)
    for key, value in kwargs.items():
        if key not in ("decoding", "tokenizer"):
            setattr(config, key, value)
    return config


def _request(config: GenerationConfig, row: PromptRow, ids: list[int], generate_kwargs: dict) -> GenerationRequest:
    own = copy.deepcopy(config)
    own.update(**{key: value for key, value in row.overrides.items() if key in PER_REQUEST})
    stop = own.stop_strings
    return GenerationRequest(
        list(ids), own.max_new_tokens, [stop] if isinstance(stop, str) else stop, str(row.index),
        SamplingParams.from_generation_config(own),
    )


def _result(tokenizer, row: PromptRow, prompt_tokens: int, result) -> tuple[int, dict]:
    if result.error is not None:
        raise RuntimeError(f"{row.where}: {result.error}")
    return row.index, result_entry(tokenizer, row, result.tokens, result.finish_reason, prompt_tokens, result.stats, 0)
