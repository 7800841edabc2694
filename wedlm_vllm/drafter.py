"""The WeDLM drafter: vLLM's custom proposer (`speculative_config={"method": "custom_class", ...}`).

Each forward of the target model feeds, per request, its last token, the drafts under verification and then mask
slots, each at its own position. Attention is causal, so the mask slots change nothing vLLM verifies, and a mask
slot's logits predict the token at its own position (one slot later than the next-token convention of vLLM's
drafts). When every draft of a request passes, the mask slots after the one at the new token's position are its
next drafts; after a rejection they saw a wrong token and are dropped. vLLM's rejection sampler verifies every
draft (a mask slot too: it is rejected unless the model itself emits the mask id), so the output is the model's.

Everything the drafter reads is computed outside the model's forward (`step.py`): the logits vLLM's runner
computes at every fed position, and the step's scheduling. It keeps no state between steps beyond counters: a
request's width comes from its last forward (`schedule.py`).
"""

import functools
from dataclasses import dataclass

import numpy as np
import torch
from vllm.config import VllmConfig

from .checks import request_slots
from .config import check_model
from .cost import forward_scale, pays_at, priced
from .counters import zeroed
from .options import DRAFTER_CLASS, DrafterOptions
from .schedule import LastForward, gain_per_token, is_probe, next_width, probes_at, split
from .step import LogitsTap, Row, install_hand_off, read_rows

LOOKUP_NGRAM = 2
LOOKUP_TOKENS = 10
"""Prompt lookup: the n-gram that must match, and the most tokens one match drafts (`wedlm_hf`'s defaults)."""


@dataclass
class Plan:
    """One request's next forward: its width (draft tokens) and where its mask-slot predictions sit in the step's."""

    last: LastForward
    budget: int
    width: int
    predicted: range
    """The rows of the step's logits whose argmax are its next drafts."""
    offset: int = 0
    """Where they start among the predictions read."""


class WeDLMDrafter:
    """Drafts from the target's own mask slots, `options` (see `DrafterOptions`) spelt in the class name."""

    options = DrafterOptions()

    def __init__(self, vllm_config: VllmConfig):
        model_config = vllm_config.model_config
        self.mask_token_id = check_model(model_config.hf_config, list(model_config.architectures), self.options)
        self.budget = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = model_config.max_model_len
        self.tap: LogitsTap | None = None
        self.rows: list[Row] | None = None
        """The step just run, one row per request (`read_step`); None where it could not be read."""
        self.nothing_to_plan = False
        """Whether every request's next width is 0 whatever its acceptance (`read_step`): then nothing is
        planned, per request, for the next step."""
        self.stats = zeroed()
        device_type = getattr(getattr(vllm_config, "device_config", None), "device_type", "cuda")
        self.scale = forward_scale(device_type, self.options.forward_scale)
        """Tokens a step carries for the price of its fixed part (`cost.py`)."""
        if self.options.prompt_lookup:  # vLLM's own n-gram search (compiled by numba on import)
            from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

            self._lookup = _find_longest_matched_ngram_and_propose_tokens
        install_hand_off()

    def load_model(self, model: torch.nn.Module) -> None:
        """vLLM hands over the target model: the logits it computes are what the drafter reads."""
        self.tap = LogitsTap(model)

    def read_step(self, runner, scheduler_output, spec_decode_metadata) -> None:
        """Called by the runner before `propose` (`step.install_hand_off`)."""
        self.nothing_to_plan = self._nothing_to_plan(runner, scheduler_output)
        if not self.nothing_to_plan:
            self.rows = read_rows(runner, scheduler_output, spec_decode_metadata, self.mask_token_id, request_slots)

    def _nothing_to_plan(self, runner, scheduler_output) -> bool:
        """Whether the step verified no draft (every request fed one token or a prompt chunk) and either no draft
        can pay at the batch's size or every request fed one token of its decode and none is due to probe: then
        every next width is 0 (`schedule.next_width`), found without reading and planning each request."""
        if scheduler_output.scheduled_spec_decode_tokens or self.options.prompt_lookup:
            return False
        req_ids = runner.input_batch.req_ids
        if not pays_at(len(req_ids), self.scale):
            return True
        fed, requests = scheduler_output.num_scheduled_tokens, runner.requests
        for req_id in req_ids:
            outputs = len(requests[req_id].output_token_ids)
            if fed.get(req_id) != 1 or outputs <= 1 or probes_at(outputs):
                return False
        return True

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings=None,
    ) -> list[list[int]]:
        """Per request (rows of vLLM's input batch, in the forward's order): drafts, then mask slots."""
        rows, logits = self.rows, self.tap.take()
        self.rows = None
        if self.nothing_to_plan:  # every request fed one token and got at most one: count them, draft nothing
            self.nothing_to_plan = False
            returned = sum(1 for sampled in sampled_token_ids if sampled)
            self.stats["forwards"] += returned
            self.stats["tokens"] += returned
            return [[] for _ in sampled_token_ids]
        if rows is None or len(rows) < len(sampled_token_ids):  # not read: no drafts this step, output unchanged
            return [[] for _ in sampled_token_ids]
        plans = []
        for row, sampled in zip(rows, sampled_token_ids):
            if not sampled:  # a prompt chunk before the last
                plans.append(None)
                continue
            last = LastForward(
                drafts=row.drafts,
                masks=row.masks,
                accepted=len(sampled) - 1,
                prefill=row.prefill(sampled),
                length=row.outputs,
            )
            self._count(last, row.returned(sampled))
            usable = not last.prefill and last.accepted == last.drafts and last.masks >= 2
            first_mask = row.logits_start + 1 + row.drafts  # the slot at the new token's own position
            predicted = range(first_mask + 1, first_mask + row.masks) if usable else range(0)
            budget = self.budget if row.slots is None else min(self.budget, row.slots)
            plans.append(Plan(last, budget, next_width(last, budget), predicted))
        self._price([plan for plan in plans if plan is not None])
        wanted = []
        for plan in plans:
            if plan is not None and plan.width:
                plan.offset = len(wanted)
                wanted.extend(plan.predicted)
        predictions = self._predict(logits, wanted)
        return [
            [] if plan is None else self._row_drafts(plan, predictions, index, num_tokens_no_spec, token_ids_cpu)
            for index, plan in enumerate(plans)
        ]

    def _price(self, plans: list[Plan]) -> None:
        """Set to 0 the widths whose expected accepted drafts do not pay for their tokens at this batch's size
        (`cost.priced`); a probe (two mask slots after one-token forwards) runs wherever some width can pay at
        this batch's size, so a width can return once the batch is small enough."""
        probes_run = pays_at(len(plans), self.scale)
        priceable = [plan for plan in plans if not (probes_run and is_probe(plan.last, plan.width))]
        gains = [gain_per_token(plan.last) for plan in priceable]
        widths = priced([plan.width for plan in priceable], gains, self.scale)
        for plan, width in zip(priceable, widths):
            plan.width = width

    def _row_drafts(self, plan: Plan, predictions, index, num_tokens_no_spec, token_ids_cpu) -> list[int]:
        width, budget = plan.width, plan.budget
        if width == 0 and (budget == 0 or not self.options.prompt_lookup):
            return []
        drafts = []
        read = predictions[plan.offset : plan.offset + len(plan.predicted)] if width else []
        for token in read:  # the leading run that is no mask id
            if token == self.mask_token_id:
                break
            drafts.append(token)
        if not drafts and self.options.prompt_lookup:
            drafts = self._lookup_drafts(token_ids_cpu[index, : num_tokens_no_spec[index]])[:budget]
            if width == 0:
                return drafts
        kept, masks = split(width, len(drafts))
        return drafts[:kept] + [self.mask_token_id] * masks

    def _predict(self, logits: torch.Tensor | None, rows: list[int]) -> list[int]:
        """The argmax token of each of these rows of the step's logits (one gather for the whole batch); none
        where the logits are missing (a tensor-parallel rank that holds no logits) or shorter than the rows."""
        if not rows or logits is None or logits.shape[0] <= rows[-1]:
            return []
        return logits[torch.tensor(rows, device=logits.device)].argmax(dim=-1).tolist()

    def _lookup_drafts(self, tokens: np.ndarray) -> list[int]:
        found = self._lookup(tokens, LOOKUP_NGRAM, LOOKUP_NGRAM, self.max_model_len, LOOKUP_TOKENS)
        return [] if found is None else [int(token) for token in found]

    def _count(self, last: LastForward, returned: int) -> None:
        self.stats["forwards"] += 1
        self.stats["tokens"] += returned
        if not last.prefill:
            self.stats["drafted"] += last.drafts
            self.stats["accepted"] += last.accepted
            self.stats["mask_slots"] += last.masks


@functools.cache
def _drafter_class(name: str) -> type[WeDLMDrafter]:
    return type(name, (WeDLMDrafter,), {"options": DrafterOptions.from_class_name(name), "__module__": __name__})


def __getattr__(name: str):
    """`WeDLMDrafter__mask_token_id_16` and the like: the drafter with the options its name spells."""
    if name.startswith(DRAFTER_CLASS + "__"):
        return _drafter_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
