"""The WeDLM drafter: vLLM's custom proposer (`speculative_config={"method": "custom_class", ...}`).

Each forward of the target model feeds, per request, its last token, the drafts under verification and then mask
slots, each at its own position. Attention is causal, so the mask slots change nothing vLLM verifies, and a mask
slot's logits predict the token at its own position (one slot later than the next-token convention of vLLM's
drafts). When every draft of a request passes, the mask slots after the one at the new token's position are its
next drafts; after a rejection they saw a wrong token and are dropped. vLLM's rejection sampler verifies every
draft (a mask slot too: it is rejected unless the model itself emits the mask id), so the output is the model's.

The drafter reads the forward through a hook on the model (`capture.py`) and keeps no state between forwards
beyond counters: a request's width comes from its last forward (`schedule.py`).
"""

import functools

import numpy as np
import torch
from vllm.config import VllmConfig
from vllm.logger import init_logger

from .capture import ForwardCapture
from .config import check_model
from .counters import zeroed
from .options import DRAFTER_CLASS, DrafterOptions
from .schedule import LastForward, next_width, split

LOOKUP_NGRAM = 2
LOOKUP_TOKENS = 10
"""Prompt lookup: the n-gram that must match, and the most tokens one match drafts (`wedlm_hf`'s defaults)."""
WHOLE_GRAPH = (
    "WeDLM drafting saw no forward: vLLM replayed it as a whole CUDA graph, so requests decode one token per "
    "forward; pass compilation_config={'cudagraph_mode': 'PIECEWISE'} (or enforce_eager=True) to draft"
)

logger = init_logger(__name__)


class WeDLMDrafter:
    """Drafts from the target's own mask slots, `options` (see `DrafterOptions`) spelt in the class name."""

    options = DrafterOptions()

    def __init__(self, vllm_config: VllmConfig):
        model_config = vllm_config.model_config
        self.mask_token_id = check_model(model_config.hf_config, list(model_config.architectures), self.options)
        self.budget = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = model_config.max_model_len
        self.capture: ForwardCapture | None = None
        self.seen = 0
        """`capture.count` at the last proposal."""
        self.stats = zeroed()
        if self.options.prompt_lookup:  # vLLM's own n-gram search (compiled by numba on import)
            from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

            self._lookup = _find_longest_matched_ngram_and_propose_tokens

    def load_model(self, model: torch.nn.Module) -> None:
        """vLLM hands over the target model: its forwards are what the drafter reads."""
        self.capture = ForwardCapture(model)

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings=None,
    ) -> list[list[int]]:
        """Per request (rows of vLLM's input batch, in the forward's order): drafts, then mask slots."""
        forward, rows = self.capture.last, len(sampled_token_ids)
        if self.capture.count == self.seen:  # replayed as a whole CUDA graph: nothing read, no drafts
            logger.warning_once(WHOLE_GRAPH)
            return [[] for _ in range(rows)]
        self.seen = self.capture.count
        starts = forward.query_start_loc[: rows + 1].tolist()
        ids = forward.input_ids[: starts[-1]].tolist()
        positions = forward.positions[: starts[-1]].tolist()
        plans, wanted = [], []
        for row, sampled in enumerate(sampled_token_ids):
            if not sampled:  # a prompt chunk before the last
                plans.append(None)
                continue
            start, end = starts[row], starts[row + 1]
            fed, length = end - start, int(num_tokens_no_spec[row])
            first_mask = end
            while first_mask > start + 1 and ids[first_mask - 1] == self.mask_token_id:
                first_mask -= 1
            last = LastForward(
                drafts=first_mask - start - 1,
                masks=end - first_mask,
                accepted=len(sampled) - 1,
                # a prompt's last chunk: several tokens fed, one sampled after all of them
                prefill=fed > 1 and len(sampled) == 1 and length == positions[start] + fed + 1,
                length=length,
            )
            self._count(last, len(sampled))
            usable = not last.prefill and last.accepted == last.drafts and last.masks >= 2
            predicted = range(first_mask + 1, end) if usable else range(0)
            plans.append((last, len(wanted), len(predicted)))
            wanted.extend(predicted)
        predictions = self._predict(forward.hidden_states, wanted)
        return [
            [] if plan is None else self._row_drafts(plan, predictions, row, num_tokens_no_spec, token_ids_cpu)
            for row, plan in enumerate(plans)
        ]

    def _row_drafts(self, plan, predictions, row, num_tokens_no_spec, token_ids_cpu) -> list[int]:
        last, offset, count = plan
        drafts = []
        for token in predictions[offset : offset + count]:  # the leading run that is no mask id
            if token == self.mask_token_id:
                break
            drafts.append(token)
        width = next_width(last, self.budget)
        if not drafts and self.options.prompt_lookup:
            drafts = self._lookup_drafts(token_ids_cpu[row, : num_tokens_no_spec[row]])
            if width == 0:
                return drafts
        kept, masks = split(width, len(drafts))
        return drafts[:kept] + [self.mask_token_id] * masks

    def _predict(self, hidden_states: torch.Tensor, rows: list[int]) -> list[int]:
        """The argmax token of each of these rows of the forward (one logits call for the whole batch)."""
        if not rows:
            return []
        logits = self.capture.model.compute_logits(hidden_states[torch.tensor(rows, device=hidden_states.device)])
        return [] if logits is None else logits.argmax(dim=-1).tolist()  # None: a tensor-parallel rank but the first

    def _lookup_drafts(self, tokens: np.ndarray) -> list[int]:
        found = self._lookup(tokens, LOOKUP_NGRAM, LOOKUP_NGRAM, self.max_model_len, LOOKUP_TOKENS)
        return [] if found is None else [int(token) for token in found]

    def _count(self, last: LastForward, tokens: int) -> None:
        self.stats["forwards"] += 1
        self.stats["tokens"] += tokens
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
