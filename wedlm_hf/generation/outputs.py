"""What a WeDLM `generate` returns besides the sequences: the decoding statistics of spec §3."""

from dataclasses import dataclass, field

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

EOS, STOP, LENGTH, CANCELLED, ERROR = "eos", "stop", "length", "cancelled", "error"
"""Why a row ended: its EOS token; a stop string (or another stopping criterion of the call); its max_new_tokens;
cancelled by a client; failed. The decode loop records the first three (`OutputRecord.commit`) and a row the
scheduler drops (`OutputRecord.cancel`); a failure only the server knows (its loop is gone). Strings, not an enum:
`generation/` is exported as flat remote code (docs/architecture.md)."""
ENDED_BY = ("", EOS, STOP, LENGTH, CANCELLED)
"""`OutputRecord.finish` codes: each reason's index ("": still running)."""


@dataclass
class WeDLMStats:
    """Per-row counters of one WeDLM `generate` call, plus the number of batched model calls it made.

    `forwards[i]` counts the forwards row i took part in (the prefill, fused with the first window, included);
    `processed[i]` sums the window lengths row i fed. p_cache (prefix cacheability) = generated / processed.
    `fill_steps[i][t]` / `commit_steps[i][t]`: the forward (1-based) whose logits filled generated token t of row
    i, and the forward that committed it (a commit that ends a row needs no forward and gets the next number).
    """

    forwards: list[int]
    generated: list[int]
    processed: list[int]
    model_calls: int = 0
    fill_steps: list[list[int]] = field(default_factory=list)
    commit_steps: list[list[int]] = field(default_factory=list)
    drafted: list[int] | None = None
    """Lossless mode only: drafts checked, drafts accepted, and forwards that corrected a draft, per row."""
    accepted: list[int] | None = None
    corrected: list[int] | None = None
    finish_reasons: list[str] = field(default_factory=list)
    """Why each row ended: `EOS`, `STOP` or `LENGTH` (a request continuous batching dropped: `CANCELLED`)."""

    @property
    def tokens_per_forward(self) -> list[float]:
        return [g / f if f else 0.0 for g, f in zip(self.generated, self.forwards)]

    @property
    def tokens_per_forward_row_mean(self) -> float:
        """Mean over rows of each row's tokens per forward: what parallel decoding gained a sequence (1.0 = none)."""
        return sum(self.tokens_per_forward) / len(self.generated) if self.generated else 0.0

    @property
    def p_cache(self) -> list[float]:
        return [g / p if p else 0.0 for g, p in zip(self.generated, self.processed)]

    @property
    def total_generated(self) -> int:
        return sum(self.generated)

    @property
    def tokens_per_batched_forward(self) -> float:
        """All rows' tokens per model call: grows with the batch size even with no parallel decoding at all."""
        return self.total_generated / self.model_calls if self.model_calls else 0.0

    @property
    def total_p_cache(self) -> float:
        processed = sum(self.processed)
        return self.total_generated / processed if processed else 0.0

    def summary(self) -> dict:
        """Totals over the batch; the two tokens-per-forward figures are equal for a batch of one."""
        lossless = {} if self.drafted is None else {
            "drafted": sum(self.drafted), "accepted": sum(self.accepted), "corrected": sum(self.corrected)
        }
        return lossless | {
            "generated": self.total_generated,
            "forwards": self.model_calls,
            "tokens_per_forward_row_mean": round(self.tokens_per_forward_row_mean, 3),
            "tokens_per_batched_forward": round(self.tokens_per_batched_forward, 3),
            "processed": sum(self.processed),
            "p_cache": round(self.total_p_cache, 3),
        }


@dataclass
class WeDLMGenerateOutput(GenerateDecoderOnlyOutput):
    """transformers' decoder-only output with the WeDLM statistics attached."""

    wedlm_stats: WeDLMStats | None = field(default=None)


def usable_outside_inference_mode(output: WeDLMGenerateOutput | torch.Tensor) -> WeDLMGenerateOutput | torch.Tensor:
    """`output`'s tensors as ordinary ones (clones made outside inference mode), so they serve as `generate()`'s
    own do: saved for a backward pass (training on generated text), changed in place."""
    if isinstance(output, torch.Tensor):
        return output.clone()
    output.sequences = output.sequences.clone()
    for kind in ("scores", "logits"):
        if getattr(output, kind) is not None:
            setattr(output, kind, tuple(values.clone() for values in getattr(output, kind)))
    return output
