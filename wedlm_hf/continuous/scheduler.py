"""Continuous batching for WeDLM decoding: requests join the running batch at step boundaries and leave it when
they end, so one forward per step serves every running request.

A request waits in a queue until the admission policy (admission.py; by default first come, first served while a
row is free, `max_batch_size`, and its tokens fit, `max_batch_tokens`: prompt plus max_new_tokens, summed over the
batch) starts it. Each step is admit -> prefill and join -> advance -> report. Admitted requests are decoded first
in a batch of their own
(their prompt and first window in one forward, as `generate` does), then settled and *joined*: their window
state, draft state, cached K/V (left-padded to the running batch's columns) and output rows are appended to the
running batch (`DecodeLoop.join`). Every row keeps its own positions, window, budget and stopping criteria, so
its output is what a `generate` call of its own produces (greedy and lossless; batched rows differ from lone ones
only where floating-point sums over a wider, padded batch flip a near-tie, as in batched `generate`).

Sampling, logits processors, EOS and the WeDLM settings belong to the batch: one generation config per scheduler.
A fault in a request's first step fails that request alone; a fault in a shared step fails the running requests
(each gets one error) and the scheduler carries on with an empty batch.
"""

import copy
from collections import deque
from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase, StoppingCriteriaList
from transformers import StopStringCriteria

from ..generation.decoding import output_record, policy_class, start_decoding
from ..generation.loop import DecodeLoop
from ..generation.outputs import CANCELLED, ERROR
from ..generation.record import OutputRecord
from ..generation.settings import WeDLMSettings
from ..generation.processors import split_suppressed
from ..generation.window import WindowLayout
from ..generation.validation import check_request, check_settings, position_limit_error
from .admission import AdmissionPolicy, FirstComeFirstServed
from .requests import GenerationRequest, RequestResult, RequestUpdate


@dataclass
class RequestState:
    """A request from admission to its final update: the output record row it holds, the tokens reported so far,
    and the forward count of the running batch before its first forward (`OutputRecord.row_stats`)."""

    request: GenerationRequest
    row: int
    step_offset: int = 0
    tokens: list[int] = field(default_factory=list)

    def result(self, finish_reason: str, stats=None, error: str | None = None) -> RequestResult:
        return RequestResult(self.request.request_id, self.tokens, finish_reason, stats, error)


class WeDLMScheduler:
    """Admits, decodes and retires requests; `step()` runs one step and returns what each request gained."""

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
    ):
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"`max_batch_size` must be an integer >= 1, got {max_batch_size!r}.")
        self.model, self.tokenizer = model, tokenizer
        self.config = config = copy.deepcopy(generation_config or model.generation_config)
        self.device = device = model.device
        model._prepare_special_tokens(config, kwargs_has_attention_mask=True, device=device)
        processors = model._get_logits_processor(config, device=device, model_kwargs={})
        check_request(model, config, {}, synced_gpus=False)
        self.processors, suppressed = split_suppressed(processors)
        self.vocab_size = model.config.get_text_config().vocab_size
        self.settings = WeDLMSettings.resolve(config, model.config, self.vocab_size)
        check_settings(self.settings, model, config, self.processors)
        if self.settings.static:
            raise ValueError("`wedlm_static=True` preallocates a fixed batch, so requests cannot join it; drop it.")
        if config.output_scores or config.output_logits:
            raise ValueError("Continuous batching returns tokens and statistics, not scores or logits; drop them.")
        limit = max_sequence_length or getattr(model.config.get_text_config(), "max_position_embeddings", None)
        if not limit:
            raise ValueError("The model declares no max_position_embeddings: pass `max_sequence_length=`.")
        self.max_sequence_length = int(limit)
        self.max_batch_size, self.max_batch_tokens = max_batch_size, max_batch_tokens
        self.layout = WindowLayout.create(
            self.settings.mask_token_id, self.settings.window_size, self.max_sequence_length, device, suppressed
        )
        self.admission = admission or FirstComeFirstServed(max_batch_tokens)
        self.queue: deque[GenerationRequest] = deque()
        self.rows: list[RequestState | None] = [None] * max_batch_size
        """The request holding each row of the running batch's output record."""
        self.running_rows: list[int] = []
        """The output record row of each running request, in the running batch's row order."""
        self.cancelled: set[str] = set()
        self.loop = self._empty_batch()
        self.pad_id = self.loop.record.pad_id

    # ----- requests in -----

    def check(self, request: GenerationRequest) -> None:
        """Raise a ValueError saying why `request` cannot be served; pure, so callers may check before queueing."""
        prompt, budget = request.input_ids, request.max_new_tokens
        if len(prompt) == 0:
            raise ValueError("The prompt is empty: WeDLM decoding needs at least one prompt token.")
        if any(not isinstance(token, int) or not 0 <= token < self.vocab_size for token in prompt):
            raise ValueError(f"Prompt token ids must be integers in [0, {self.vocab_size}).")
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
        return {request.request_id for request in self.queue} | {held.request.request_id for held in self.rows if held}

    def has_work(self) -> bool:
        return bool(self.queue or self.running_rows or self.cancelled)

    # ----- one step -----

    @torch.no_grad()
    def step(self) -> list[RequestUpdate]:
        """Drop cancelled requests, admit what the policy starts (their prefill, then they join), run one forward
        of the running batch, report."""
        updates = self._drop_cancelled()
        ended = self._start(self._admitted(), updates)
        if self.running_rows:
            try:
                self.loop.advance()
                going = self.loop.settle()
            except Exception as error:  # a shared step: every request in the batch fails, once
                updates += [self._failed(row, error) for row in self.running_rows + ended]
                self.running_rows, self.loop, ended = [], self._empty_batch(), []
            else:
                going_on = set(going)
                ended += [row for i, row in enumerate(self.running_rows) if i not in going_on]
                self.running_rows = [self.running_rows[i] for i in going]
        return updates + self._report(ended)

    def _drop_cancelled(self) -> list[RequestUpdate]:
        cancelled, self.cancelled = self.cancelled, set()
        updates = [
            RequestUpdate(r.request_id, [], RequestResult(r.request_id, [], CANCELLED))
            for r in self.queue if r.request_id in cancelled
        ]
        self.queue = deque(r for r in self.queue if r.request_id not in cancelled)
        dropped = [i for i, row in enumerate(self.running_rows) if self.rows[row].request.request_id in cancelled]
        if dropped:
            going = [i for i in range(len(self.running_rows)) if i not in dropped]
            self.loop.keep_rows(going)
            for i in dropped:
                held, self.rows[self.running_rows[i]] = self.rows[self.running_rows[i]], None
                updates.append(RequestUpdate(held.request.request_id, [], held.result(CANCELLED)))
            self.running_rows = [self.running_rows[i] for i in going]
        return updates

    def _admitted(self) -> list[tuple[GenerationRequest, int]]:
        """The requests the admission policy starts now, each with the free output row it will hold."""
        free = [i for i, held in enumerate(self.rows) if held is None]
        running = [held.request for held in self.rows if held]
        return list(zip(self.admission.admit(self.queue, len(free), running), free))

    def _start(self, group: list[tuple[GenerationRequest, int]], updates: list[RequestUpdate]) -> list[int]:
        """Prefill `group` and join it to the running batch (a request whose prefill fails fails alone); returns
        the rows of the requests that ended already."""
        if not group:
            return []
        if len(group) > 1:
            try:
                return self._join(group)
            except Exception:  # find the request at fault: each alone
                pass
        ended = []
        for request, row in group:
            try:
                ended += self._join([(request, row)])
            except Exception as error:
                updates.append(self._failed(row, error, request))
        return ended

    def _join(self, group: list[tuple[GenerationRequest, int]]) -> list[int]:
        """Decode the first step of `group` (requests and their free rows) in a batch of its own, then join its
        rows to the running batch; returns the rows of the requests that already ended."""
        requests, rows = [request for request, _ in group], [row for _, row in group]
        longest = max(len(request.input_ids) for request in requests)
        input_ids = torch.full((len(group), longest), self.pad_id, dtype=torch.long, device=self.device)
        mask = torch.zeros_like(input_ids)
        for i, request in enumerate(requests):  # left padding, as batched generate
            input_ids[i, longest - len(request.input_ids) :] = torch.tensor(request.input_ids)
            mask[i, longest - len(request.input_ids) :] = 1
        budgets = torch.tensor([request.max_new_tokens for request in requests], device=self.device)
        record = self._record(input_ids)
        record.row_criteria = {i: self._criteria(r) for i, r in enumerate(requests) if r.stop_strings}
        padded = any(len(request.input_ids) < longest for request in requests)
        loop = start_decoding(
            self.model, input_ids, mask, padded, budgets, self.layout, self.settings, self.config, self.processors,
            record,
        )
        loop.settle()
        loop.advance()
        going = loop.settle()
        step_offset = self.loop.join(loop, torch.tensor(rows, device=self.device))
        for request, row in group:
            self.rows[row] = RequestState(request, row, step_offset)
        self.running_rows += [rows[i] for i in going]
        going_on = set(going)
        return [row for i, row in enumerate(rows) if i not in going_on]

    def _criteria(self, request: GenerationRequest) -> list:
        return list(StoppingCriteriaList([StopStringCriteria(self.tokenizer, request.stop_strings)]))

    def _record(self, input_ids: torch.Tensor) -> OutputRecord:
        return output_record(
            input_ids, self.layout, self.config, StoppingCriteriaList(), None, (), self.vocab_size,
            policy_class(self.settings),
        )

    def _empty_batch(self) -> DecodeLoop:
        """A running batch of no rows, over an output record of `max_batch_size` rows whose prompts are
        right-aligned to the longest a request may have."""
        shape = (self.max_batch_size, self.max_sequence_length)
        prompts = torch.zeros(shape, dtype=torch.long, device=self.device)  # `adopt` pads each row it fills
        budgets = torch.zeros(self.max_batch_size, dtype=torch.long, device=self.device)
        loop = start_decoding(
            self.model, prompts, torch.zeros_like(prompts), True, budgets, self.layout, self.settings, self.config,
            self.processors, self._record(prompts),
        )
        loop.keep_rows([])
        return loop

    # ----- updates out -----

    def _report(self, ended: list[int]) -> list[RequestUpdate]:
        """Each running or ended request's new tokens, as the loop hands them back, and the ended ones' results
        (their finish reason as the loop recorded it)."""
        held = {row: self.rows[row] for row in self.running_rows + ended}
        if not held:
            return []
        committed = self.loop.committed_since({row: len(state.tokens) for row, state in held.items()})
        updates = []
        for row, state in held.items():
            new_tokens = committed[row]
            state.tokens += new_tokens
            result = None
            if row in ended:
                self.rows[row] = None
                stats = self.loop.record.row_stats(row, state.step_offset)
                result = state.result(stats.finish_reasons[0], stats)
            if new_tokens or result is not None:
                updates.append(RequestUpdate(state.request.request_id, new_tokens, result))
        return updates

    def fail_all(self, error: Exception) -> list[RequestUpdate]:
        """Fail every queued and running request (the caller hit a fault outside any one request) and start over."""
        updates = [self._failed(row, error) for row, held in enumerate(self.rows) if held is not None]
        updates += [self._failed(None, error, request) for request in self.queue]
        self.queue.clear()
        self.running_rows, self.loop = [], self._empty_batch()
        return updates

    def _failed(self, row: int | None, error: Exception, request: GenerationRequest | None = None) -> RequestUpdate:
        if row is not None:
            request = request or self.rows[row].request
            self.rows[row] = None
        message = f"{type(error).__name__}: {error}"
        return RequestUpdate(request.request_id, [], RequestResult(request.request_id, [], ERROR, error=message))
