"""Continuous batching for WeDLM decoding: requests join the running batch at step boundaries and leave it when
they end, so one forward per step serves every running request.

A request waits in a queue until the admission policy (admission.py; by default first come, first served while a
row is free, `max_batch_size`, and its tokens fit, `max_batch_tokens`: prompt plus max_new_tokens, summed over the
batch) starts it. Each step is admit -> prefill and join -> advance -> report, as a small inference engine's:
the scheduler keeps the queue and the cancellations, each running request is one record (`Sequence`, sequence.py:
prompt, budget, sampling, stop strings, its row and blocks, the tokens reported), the running batch (batch.py)
keeps the rows, and `RunningRequests` (running.py) is the one place records and rows join and leave together.
Admitted requests are decoded through their first step in a batch of their own, then join the running batch; a
request that ended is reported, then its row is forgotten.
Every row keeps its own positions, window, budget and stopping criteria, so its output is what a `generate` call
of its own produces (greedy and lossless; batched rows differ from lone ones only where floating-point sums over a
wider, padded batch flip a near-tie, as in batched `generate`).

Each request samples with its own settings (`GenerationRequest.sampling`, else the scheduler's generation config's);
logits processors, EOS and the WeDLM settings belong to the batch: one generation config per scheduler.
A fault in a request's first step or while it joins fails that request alone (a join builds the joined state
before it replaces the running one, `DecodeLoop.join`); so does one the decoder pins on rows of a shared step
(lossless decoding whose greedy next token is the mask token); any other fault in a shared step fails the running
requests (each gets one error) and the scheduler carries on (the next admitted group starts a new batch).
"""

from collections import deque

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from ..generation.draft_state import MaskTokenPredicted
from ..generation.outputs import CANCELLED
from ..generation.sampling import SamplingParams
from ..generation.validation import position_limit_error
from .admission import AdmissionPolicy, FirstComeFirstServed
from .batch import RunningBatch
from .history import RequestHistory
from .requests import GenerationRequest, RequestResult, RequestUpdate, error_update
from .running import RunningRequests


class WeDLMScheduler:
    """Admits, decodes and retires requests; `step()` runs one step and returns what each request gained.

    `max_sequence_length` bounds a request's prompt plus max_new_tokens (default: the model's positions); the K/V
    pool holds blocks for the positions each row has reached, whatever that bound. `kv_pool=False` keeps the
    running rows' K/V in one growing cache instead of the pool (batch.py).
    `draft_history` (tokens; lossless decoding only) keeps the prompts and outputs of ended requests, newest first,
    for drafting the next ones (history.py), for workloads that repeat themselves."""

    def __init__(
        self,
        model: PreTrainedModel,
        generation_config: GenerationConfig | None = None,
        *,
        max_batch_size: int = 8,
        max_batch_tokens: int | None = None,
        max_sequence_length: int | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        admission: AdmissionPolicy | None = None,
        kv_pool: bool | None = None,
        draft_history: int | None = None,
    ):
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"`max_batch_size` must be an integer >= 1, got {max_batch_size!r}.")
        if kv_pool not in (None, True, False):
            raise ValueError(f"`kv_pool` must be True, False or None (a pool where attention allows), got {kv_pool!r}.")
        self.model, self.tokenizer = model, tokenizer
        self.history = RequestHistory(draft_history, model.device) if draft_history else None
        self.batch = RunningBatch(
            model, generation_config, max_sequence_length, tokenizer, max_batch_size, kv_pool, self.history
        )
        self.max_sequence_length = self.batch.max_sequence_length
        self.max_batch_size, self.max_batch_tokens = max_batch_size, max_batch_tokens
        self.admission = admission or FirstComeFirstServed(max_batch_tokens)
        self.queue: deque[GenerationRequest] = deque()
        self.running = RunningRequests(self.batch)
        """The running requests' records, and where they join and leave the batch."""
        self.cancelled: set[str] = set()

    # ----- requests in -----

    def check(self, request: GenerationRequest) -> None:
        """Raise a ValueError saying why `request` cannot be served; pure, so callers may check before queueing."""
        prompt, budget = request.input_ids, request.max_new_tokens
        if len(prompt) == 0:
            raise ValueError("The prompt is empty: WeDLM decoding needs at least one prompt token.")
        vocab_size = self.batch.setup.vocab_size
        if any(not isinstance(token, int) or not 0 <= token < vocab_size for token in prompt):
            raise ValueError(f"Prompt token ids must be integers in [0, {vocab_size}).")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"`max_new_tokens` must be an integer >= 1, got {budget!r}.")
        problem = position_limit_error(self.model, len(prompt), budget)
        if problem is None and len(prompt) + budget > self.max_sequence_length:
            problem = (
                f"{len(prompt)} prompt tokens plus max_new_tokens={budget} exceed the scheduler's "
                f"max_sequence_length ({self.max_sequence_length})"
            )
        if problem is not None:
            raise ValueError(f"The request's {problem}")
        if self.max_batch_tokens is not None and request.reserved_tokens > self.max_batch_tokens:
            raise ValueError(
                f"The request's {len(prompt)} prompt tokens plus max_new_tokens={budget} exceed the batch's token "
                f"budget ({self.max_batch_tokens}); lower max_new_tokens or raise max_batch_tokens."
            )
        if request.sampling is not None and not isinstance(request.sampling, SamplingParams):
            raise ValueError(f"`sampling` must be a SamplingParams, got {type(request.sampling).__name__}.")
        if request.sampling is not None and any(token >= vocab_size for token, _ in request.sampling.logit_bias):
            raise ValueError(f"`logit_bias` token ids must be in [0, {vocab_size}).")
        if request.stop_strings and self.tokenizer is None:
            raise ValueError("`stop_strings` need the tokenizer: build the scheduler with `tokenizer=`.")

    def add(self, request: GenerationRequest) -> None:
        self.check(request)
        if request.request_id in self.active_ids():
            raise ValueError(f"A request with id {request.request_id!r} is already queued or running.")
        self.queue.append(request)

    def cancel(self, request_id: str) -> None:
        """End the request at the next step boundary (its row leaves the batch); unknown ids are ignored."""
        self.cancelled.add(request_id)

    def active_ids(self) -> set[str]:
        return {request.request_id for request in self.queue} | {sequence.request_id for sequence in self.running}

    def has_work(self) -> bool:
        return bool(self.queue or self.running or self.cancelled)

    # ----- one step -----

    @torch.no_grad()
    def step(self) -> list[RequestUpdate]:
        """Drop cancelled requests, admit what the policy starts (their prefill, then they join), run one forward
        of the running batch, report."""
        updates = self._drop_cancelled()
        free_rows = self.max_batch_size - len(self.running)
        self._start(self.admission.admit(self.queue, free_rows, self.running.requests()), updates)
        try:
            self.batch.step()
        except MaskTokenPredicted as error:  # raised once the step settled: those rows leave, the others go on
            updates += self.running.fail(error.rows, error)
        except Exception as error:  # a shared step: every request in the batch fails, once
            return updates + self.running.fail_all(error)
        return updates + self.running.report()

    def _drop_cancelled(self) -> list[RequestUpdate]:
        """Queued requests that were cancelled end here; running ones leave the batch and are reported by this
        step's report."""
        cancelled, self.cancelled = self.cancelled, set()
        updates = [
            RequestUpdate(r.request_id, [], RequestResult(r.request_id, [], CANCELLED))
            for r in self.queue if r.request_id in cancelled
        ]
        self.queue = deque(r for r in self.queue if r.request_id not in cancelled)
        self.running.cancel(cancelled)
        return updates

    def _start(self, group: list[GenerationRequest], updates: list[RequestUpdate]) -> None:
        """Prefill `group` and join it to the running batch (a request whose prefill fails fails alone)."""
        if len(group) > 1:
            try:
                self.running.admit(group)
                return
            except Exception:  # find the request at fault: each alone
                pass
        for request in group:
            try:
                self.running.admit([request])
            except Exception as error:
                updates.append(error_update(request.request_id, error))

    # ----- failures -----

    def fail_all(self, error: Exception) -> list[RequestUpdate]:
        """Fail every queued and running request (the caller hit a fault outside any one request) and start over."""
        updates = self.running.fail_all(error) + [error_update(request.request_id, error) for request in self.queue]
        self.queue.clear()
        return updates
