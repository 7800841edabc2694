"""`batch_generate`: many prompts on one or many processes, results arriving as rows end.

WeDLM decoding runs on the continuous-batching engine (engine.py: rows join and leave one running batch); other
decoding (`decoding="ar"`), fixed shapes, per-token scores and tensor-parallel models go through `model.generate`
in length-bucketed, left-padded batches (padded.py). Under `accelerate launch` each process decodes its share
(`PartialState.split_between_processes`) and `gather_object` brings each round's results to every process, so the
main process can write them while the others go on. A tensor-parallel model (`tp_size` set) is one model spread
over all processes: every process runs every batch instead.
"""

import time
from collections.abc import Iterable, Iterator
from contextlib import nullcontext

import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .checks import check_generation_settings
from .engine import engine_rounds, runs_on_engine
from .padded import generate_batch
from .plan import Batch, encode, plan_batches
from .rounds import Round, Work
from .rows import PromptRow, rows_from_items

def batch_generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: Iterable[dict | str],
    *,
    batch_size: int = 8,
    max_padded_tokens: int | None = None,
    progress: bool = False,
    **generate_kwargs,
) -> list[dict]:
    """Generate a continuation for every row and return one result per row, in input order.

    A row is a prompt string or a dict `{"id"?, "prompt" | "messages", <override>...}` (overrides: see
    `wedlm_hf.batch.rows.OVERRIDES`); `generate_kwargs` apply to every row a row does not override. A result is
    `{"id", "continuation", "finish_reason": "eos" | "stop" | "length", "stats"}`. Under `accelerate launch` the
    rows are split across the processes and every process gets all the results.
    """
    rows = rows_from_items(rows)
    results = [None] * len(rows)
    for finished, _ in generate_in_rounds(
        model, tokenizer, rows, batch_size=batch_size, max_padded_tokens=max_padded_tokens, progress=progress,
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
    max_padded_tokens: int | None = None,
    progress: bool = False,
    **generate_kwargs,
) -> Iterator["Round"]:
    """Yield the results round by round (one batch per process per round), on every process."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"`batch_size` must be an integer >= 1, got {batch_size!r}.")
    if max_padded_tokens is not None and (not isinstance(max_padded_tokens, int) or max_padded_tokens < 1):
        raise ValueError(f"`max_padded_tokens` must be an integer >= 1 or None, got {max_padded_tokens!r}.")
    token_ids = [encode(tokenizer, row) for row in rows]
    new_tokens = check_generation_settings(model, rows, token_ids, generate_kwargs)
    batches = plan_batches(rows, token_ids, batch_size, max_padded_tokens, new_tokens)

    state = process_state()
    bar = tqdm(total=len(rows), unit="row", disable=not (progress and state.is_main_process), dynamic_ncols=True)
    start, tokens, forwards = time.perf_counter(), 0, 0
    if runs_on_engine(model, generate_kwargs):
        steps = engine_rounds(
            model, tokenizer, rows, token_ids, batch_size, max_padded_tokens, generate_kwargs, state
        )
    else:
        batches = plan_batches(rows, token_ids, batch_size, max_padded_tokens, new_tokens)
        steps = _padded_rounds(model, tokenizer, batches, generate_kwargs, state)
    for finished, work in steps:
        tokens += sum(w.tokens for w in work)
        forwards += sum(w.forwards for w in work)
        bar.update(len(finished))
        bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - start):.1f}", tok_fwd=f"{tokens / max(forwards, 1):.2f}")
        yield Round(finished, work)
    bar.close()


def _padded_rounds(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batches: list[Batch], generate_kwargs: dict,
    state: PartialState,
) -> Iterator[Round]:
    """Left-padded `generate` calls: per round one batch per process (a tensor-parallel model: every process runs
    every batch)."""
    split = state.num_processes > 1 and getattr(model, "tp_size", None) is None
    per_round = state.num_processes if split else 1
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
        yield Round(finished, work)


def process_state() -> PartialState:
    """accelerate's view of the launch (`accelerate launch`, `torchrun` or a plain process).

    `PartialState` treats processes on a machine without an accelerator as one process each unless told `cpu=True`;
    then they join one gloo group. An already initialised state (a user's `Accelerator`) is returned unchanged.
    """
    has_accelerator = torch.accelerator.is_available() if hasattr(torch, "accelerator") else torch.cuda.is_available()
    return PartialState(cpu=not has_accelerator)
