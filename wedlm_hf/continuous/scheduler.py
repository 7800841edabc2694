"""Continuous batching for WeDLM decoding: requests join the running batch at step boundaries and leave it when
they end, so one forward per step serves every running request.

A request waits in a queue until a slot is free (`max_batch_size`) and its tokens fit (`max_batch_tokens`:
prompt plus max_new_tokens, summed over the batch). Admitted requests are decoded first in a batch of their own
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
from ..generation.record import OutputRecord
from ..generation.settings import WeDLMSettings
from ..generation.processors import split_suppressed
from ..generation.window import WindowLayout
from ..generation.validation import check_request, check_settings, position_limit_error
from .requests import CANCELLED, ERROR, LENGTH, STOP, GenerationRequest, RequestResult, RequestUpdate


@dataclass
class Slot:
    """A row of the running batch's output record, held by one request from admission to its last update."""

    request: GenerationRequest
    step_offset: int = 0
    tokens: list[int] = field(default_factory=list)
    """Tokens reported so far."""


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
        self.queue: deque[GenerationRequest] = deque()
        self.slots: list[Slot | None] = [None] * max_batch_size
        self.running_slots: list[int] = []
        """The slot of each running row, in the running batch's row order."""
        self.cancelled: set[str] = set()
        self.running = self._empty_batch()
        self.pad_id = self.running.record.pad_id

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
        if self.max_batch_tokens is not None and len(prompt) + budget > self.max_batch_tokens:
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
        return {request.request_id for request in self.queue} | {s.request.request_id for s in self.slots if s}

    def has_work(self) -> bool:
        return bool(self.queue or self.running_slots or self.cancelled)

    # ----- one step -----

    @torch.no_grad()
    def step(self) -> list[RequestUpdate]:
        """Drop cancelled requests, admit what fits, run one forward of the running batch, report."""
        updates = self._drop_cancelled()
        ended = self._admit(updates)
        if self.running_slots:
            try:
                self.running.advance()
                going = self.running.settle()
            except Exception as error:  # a shared step: every running request fails, once
                updates += [self._failed(slot, error) for slot in self.running_slots]
                self.running_slots, self.running = [], self._empty_batch()
            else:
                going_on = set(going)
                ended += [slot for i, slot in enumerate(self.running_slots) if i not in going_on]
                self.running_slots = [self.running_slots[i] for i in going]
        return updates + self._report(ended)

    def _drop_cancelled(self) -> list[RequestUpdate]:
        cancelled, self.cancelled = self.cancelled, set()
        updates = [
            RequestUpdate(r.request_id, [], RequestResult(r.request_id, [], CANCELLED))
            for r in self.queue if r.request_id in cancelled
        ]
        self.queue = deque(r for r in self.queue if r.request_id not in cancelled)
        dropped = [i for i, slot in enumerate(self.running_slots) if self.slots[slot].request.request_id in cancelled]
        if dropped:
            going = [i for i in range(len(self.running_slots)) if i not in dropped]
            self.running.keep_rows(going)
            for i in dropped:
                slot = self.slots[self.running_slots[i]]
                self.slots[self.running_slots[i]] = None
                result = RequestResult(slot.request.request_id, slot.tokens, CANCELLED)
                updates.append(RequestUpdate(slot.request.request_id, [], result))
            self.running_slots = [self.running_slots[i] for i in going]
        return updates

    def _admit(self, updates: list[RequestUpdate]) -> list[int]:
        """Admit the queue's head while a slot is free and its tokens fit; returns the slots that ended already."""
        free = [i for i, slot in enumerate(self.slots) if slot is None]
        used = sum(len(s.request.input_ids) + s.request.max_new_tokens for s in self.slots if s)
        group = []
        while self.queue and len(group) < len(free):
            request = self.queue[0]
            size = len(request.input_ids) + request.max_new_tokens
            if self.max_batch_tokens is not None and used + size > self.max_batch_tokens:
                break
            used += size
            group.append((self.queue.popleft(), free[len(group)]))
        if not group:
            return []
        if len(group) > 1:
            try:
                return self._join(group)
            except Exception:  # find the request at fault: each alone
                pass
        ended = []
        for request, slot in group:
            try:
                ended += self._join([(request, slot)])
            except Exception as error:
                updates.append(self._failed(slot, error, request))
        return ended

    def _join(self, group: list[tuple[GenerationRequest, int]]) -> list[int]:
        """Decode the first step of `group` (requests and their free slots) in a batch of its own, then join its
        rows to the running batch; returns the slots of the requests that already ended."""
        requests, slots = [request for request, _ in group], [slot for _, slot in group]
        longest = max(len(request.input_ids) for request in requests)
        input_ids = torch.full((len(group), longest), self.pad_id, dtype=torch.long, device=self.device)
        mask = torch.zeros_like(input_ids)
        for row, request in enumerate(requests):  # left padding, as batched generate
            input_ids[row, longest - len(request.input_ids) :] = torch.tensor(request.input_ids)
            mask[row, longest - len(request.input_ids) :] = 1
        budgets = torch.tensor([request.max_new_tokens for request in requests], device=self.device)
        record = self._record(input_ids)
        record.row_criteria = {row: self._criteria(r) for row, r in enumerate(requests) if r.stop_strings}
        padded = any(len(request.input_ids) < longest for request in requests)
        loop = start_decoding(
            self.model, input_ids, mask, padded, budgets, self.layout, self.settings, self.config, self.processors,
            record,
        )
        loop.settle()
        loop.advance()
        going = loop.settle()
        step_offset = self.running.join(loop, torch.tensor(slots, device=self.device))
        for request, slot in group:
            self.slots[slot] = Slot(request, step_offset)
        self.running_slots += [slots[row] for row in going]
        going_on = set(going)
        return [slot for row, slot in enumerate(slots) if row not in going_on]

    def _criteria(self, request: GenerationRequest) -> list:
        return list(StoppingCriteriaList([StopStringCriteria(self.tokenizer, request.stop_strings)]))

    def _record(self, input_ids: torch.Tensor) -> OutputRecord:
        return output_record(
            input_ids, self.layout, self.config, StoppingCriteriaList(), None, (), self.vocab_size,
            policy_class(self.settings),
        )

    def _empty_batch(self) -> DecodeLoop:
        """A running batch of no rows, over an output record of `max_batch_size` slots whose prompts are
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
        """Each running or ended request's new tokens (one host read for all), and the ended ones' results."""
        record, state = self.running.record, self.running.state
        slots = self.running_slots + ended
        if not slots:
            return []
        generated = record.totals["generated"].clone()
        generated[state.rows] = state.generated
        reported = torch.tensor([len(s.tokens) if s else 0 for s in self.slots], device=self.device)
        columns = record.prompt_length + reported[:, None] + self.layout.slots
        tokens = record.sequences.gather(1, columns.clamp(max=record.sequences.shape[1] - 1))
        host = torch.cat([generated, tokens.flatten()]).tolist()
        counts, width = host[: len(self.slots)], self.layout.width
        updates = []
        for slot_index in slots:
            slot = self.slots[slot_index]
            new = counts[slot_index] - len(slot.tokens)
            start = len(self.slots) + slot_index * width
            new_tokens = host[start : start + min(new, width)]
            if new > width:  # more than a window in one step: read the rest
                begin = record.prompt_length + len(slot.tokens) + width
                new_tokens += record.sequences[slot_index, begin : begin + new - width].tolist()
            slot.tokens += new_tokens
            result = None
            if slot_index in ended:
                self.slots[slot_index] = None
                reason = LENGTH if len(slot.tokens) >= slot.request.max_new_tokens else STOP
                stats = record.row_stats(slot_index, slot.step_offset)
                result = RequestResult(slot.request.request_id, slot.tokens, reason, stats)
            if new_tokens or result is not None:
                updates.append(RequestUpdate(slot.request.request_id, new_tokens, result))
        return updates

    def fail_all(self, error: Exception) -> list[RequestUpdate]:
        """Fail every queued and running request (the caller hit a fault outside any one request) and start over."""
        updates = [self._failed(slot, error) for slot, held in enumerate(self.slots) if held is not None]
        updates += [self._failed(None, error, request) for request in self.queue]
        self.queue.clear()
        self.running_slots, self.running = [], self._empty_batch()
        return updates

    def _failed(
        self, slot_index: int | None, error: Exception, request: GenerationRequest | None = None
    ) -> RequestUpdate:
        if slot_index is not None:
            request = request or self.slots[slot_index].request
            self.slots[slot_index] = None
        message = f"{type(error).__name__}: {error}"
        return RequestUpdate(request.request_id, [], RequestResult(request.request_id, [], ERROR, error=message))
