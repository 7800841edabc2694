"""What the drafter reads of one vLLM step, all of it from outside the model's forward, so that a compiled forward
or a CUDA graph replayed whole hides nothing from it.

- The logits: vLLM's runner computes `compute_logits` after the forward, at every fed position of a decoding
  request (its last token and each draft, mask slots included), and the rejection sampler works on copies. A
  wrapper on the served model's `compute_logits` keeps a reference to the last result (no copy, no second LM-head
  pass).
- Which request each row is and what it fed: the runner hands its own `propose_draft_token_ids` the step's
  `scheduler_output` and `spec_decode_metadata`, which `propose()` is not given; a wrapper on that method reads
  them into one `Row` per request of the input batch, in the order of `propose()`'s rows.

One thing it changes in the runner: a step that verifies no draft (every request feeding one token, as at a batch
too large for drafts to pay) takes vLLM's plain sampling path instead of running the rejection sampler on zero
drafts, which costs about 5% of such a step on a CPU at 48 requests (docs/vllm.md). The plugin serves attention
models only, for which a step with no drafts is a plain step (vLLM counts it as a speculative one for recurrent
layers' state).
"""

import functools
import inspect
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import torch

from .schedule import mask_slots


@dataclass(frozen=True)
class Row:
    """One request of the step just run, as vLLM scheduled it."""

    drafts: int
    """Drafts verified (mask-slot predictions or prompt-lookup continuations)."""
    masks: int
    """Mask slots fed after the drafts."""
    fed_prompt: bool
    """Whether the step fed prompt tokens (a prompt chunk, or a preempted request recomputed)."""
    logits_start: int
    """The request's first row in the step's logits (its last token's); `drafts + masks` more follow."""
    outputs: int
    """Output tokens the request has after this step (vLLM's runner appends the sampled ones before drafting)."""
    max_tokens: int | None
    min_tokens: int
    stop_token_ids: AbstractSet[int]
    slots: int | None
    """The request's own cap on draft tokens per forward (`SamplingParams.extra_args`), or None."""

    def prefill(self, sampled: list[int]) -> bool:
        """Whether the step was the request's prompt step (its first output token) or a recomputation."""
        return self.fed_prompt or self.outputs == len(sampled)

    def returned(self, sampled: list[int]) -> int:
        """How many of `sampled` vLLM returns: up to the request's `max_tokens` and its first stop token."""
        before = self.outputs - len(sampled)
        budget = len(sampled) if self.max_tokens is None else max(0, self.max_tokens - before)
        for index, token in enumerate(sampled[:budget]):
            if token in self.stop_token_ids and before + index + 1 >= self.min_tokens:
                return index + 1
        return min(len(sampled), budget)


def read_rows(runner, scheduler_output, spec_decode_metadata, mask_token_id: int, slots_of) -> list[Row] | None:
    """One `Row` per request of `runner`'s input batch; None where the step's draft counts disagree with the
    scheduled drafts (the drafter then drafts nothing from mask slots: vLLM still verifies everything)."""
    batch = runner.input_batch
    scheduled = scheduler_output.scheduled_spec_decode_tokens
    counts = spec_decode_metadata.num_draft_tokens if spec_decode_metadata is not None else None
    rows, start = [], 0
    for index, req_id in enumerate(batch.req_ids):
        spec = list(scheduled.get(req_id, ()))
        if counts is not None and counts[index] != len(spec):
            return None
        masks = mask_slots(spec, mask_token_id)
        request = runner.requests[req_id]
        params = request.sampling_params
        fed = scheduler_output.num_scheduled_tokens.get(req_id, 0)
        rows.append(
            Row(
                drafts=len(spec) - masks,
                masks=masks,
                fed_prompt=fed > 1 + len(spec),
                logits_start=start,
                outputs=len(request.output_token_ids),
                max_tokens=getattr(params, "max_tokens", None),
                min_tokens=getattr(params, "min_tokens", 0) or 0,
                stop_token_ids=getattr(params, "all_stop_token_ids", None) or frozenset(),  # vLLM's set, not copied
                slots=slots_of(params),
            )
        )
        start += 1 + len(spec)
    return rows


class LogitsTap:
    """Keeps the last logits the served model's `compute_logits` returned (a reference, cleared once read)."""

    def __init__(self, model: torch.nn.Module):
        self.logits: torch.Tensor | None = None
        compute_logits = model.compute_logits

        @functools.wraps(compute_logits)
        def tapped(*args, **kwargs):
            self.logits = compute_logits(*args, **kwargs)
            return self.logits

        model.compute_logits = tapped  # an instance attribute: vLLM's graph wrapper forwards look-ups to it

    def take(self) -> torch.Tensor | None:
        logits, self.logits = self.logits, None
        return logits


def install_hand_off() -> None:
    """Wrap the runner's `propose_draft_token_ids` so that a drafter with `read_step` sees the step, and its
    `_prepare_inputs` so that a step verifying no draft is sampled plainly; once per process (the drafter calls it
    when vLLM builds it, inside the worker)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner, "_wedlm_hand_off", False):
        return
    original = GPUModelRunner.propose_draft_token_ids
    signature = inspect.signature(original)

    @functools.wraps(original)
    def propose_draft_token_ids(self, *args, **kwargs):
        read_step = getattr(getattr(self, "drafter", None), "read_step", None)
        if read_step is not None:
            arguments = signature.bind(self, *args, **kwargs).arguments
            read_step(self, arguments["scheduler_output"], arguments["spec_decode_metadata"])
        return original(self, *args, **kwargs)

    prepare_inputs = GPUModelRunner._prepare_inputs

    @functools.wraps(prepare_inputs)
    def _prepare_inputs(self, scheduler_output, *args, **kwargs):
        drafter = getattr(self, "drafter", None)
        if scheduler_output.scheduled_spec_decode_tokens or not hasattr(drafter, "read_step"):
            return prepare_inputs(self, scheduler_output, *args, **kwargs)
        config, self.speculative_config = self.speculative_config, None  # no draft to verify: the plain path
        try:
            return prepare_inputs(self, scheduler_output, *args, **kwargs)
        finally:
            self.speculative_config = config

    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids
    GPUModelRunner._prepare_inputs = _prepare_inputs
    GPUModelRunner._wedlm_hand_off = True
