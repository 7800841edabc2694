"""The target model's last forward, as the drafter needs it: token ids, positions, hidden states and where each
request's tokens start.

A forward hook on the model vLLM hands the proposer records references only (no copy, no host read), so the
forward itself is untouched; the drafter reads them right after vLLM's sampler, before the next forward refills
vLLM's input buffers. Request boundaries come from the attention metadata of vLLM's forward context.
"""

from dataclasses import dataclass

import torch
from vllm.forward_context import get_forward_context


@dataclass
class Forward:
    input_ids: torch.Tensor
    positions: torch.Tensor
    hidden_states: torch.Tensor
    query_start_loc: torch.Tensor
    """Offsets of each request's tokens in the forward (requests in vLLM's input-batch order), then the total."""


def query_start_loc() -> torch.Tensor:
    """The request offsets of the forward running now, from any layer's attention metadata."""
    metadata = get_forward_context().attn_metadata
    for per_layer in metadata if isinstance(metadata, list) else [metadata]:
        for layer in (per_layer or {}).values():
            offsets = getattr(layer, "query_start_loc", None)
            if offsets is not None:
                return offsets
    raise RuntimeError(
        "WeDLM drafting found no query_start_loc in vLLM's attention metadata; this attention backend is not "
        "supported (serve without speculative_config)"
    )


class ForwardCapture:
    """Holds the model, its last forward (`last`) and how many forwards ran its Python code (`count`): a forward
    replayed as a whole CUDA graph runs none, so `count` tells the drafter whether `last` is the forward just run."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.last: Forward | None = None
        self.count = 0
        model.register_forward_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs, output) -> None:
        if not isinstance(output, torch.Tensor):  # a pipeline stage before the last: nothing to draft from here
            return
        input_ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        positions = kwargs["positions"] if "positions" in kwargs else args[1]
        self.last = Forward(input_ids, positions, output, query_start_loc())
        self.count += 1
