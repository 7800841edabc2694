"""The user's options, carried inside vLLM's `speculative_config` dict.

vLLM builds a custom proposer from a class path alone (`"model": "module.Class"`) and has no field for a
proposer's own options, so the options are spelt in the class name: `WeDLMDrafter__mask_token_id_16__prompt_lookup`
is the drafter with those options. `speculative_config` writes the name; `drafter.__getattr__` reads it back. The
same dict, as JSON, is what `vllm serve --speculative-config` takes.
"""

import re
from dataclasses import dataclass, fields

DRAFTER_MODULE = "wedlm_vllm.drafter"
DRAFTER_CLASS = "WeDLMDrafter"
DEFAULT_SLOTS = 24
"""Draft tokens (real drafts and mask slots) a request may add to one forward: `num_speculative_tokens`."""

REQUEST_SLOTS = "wedlm_slots"
"""`SamplingParams(extra_args={"wedlm_slots": N})` (the OpenAI server's `vllm_xargs`): this request adds at most N
draft tokens to a forward; 0 switches WeDLM drafting off for it."""

_SEGMENT = re.compile(r"(mask_token_id|forward_scale)_(\d+)|(prompt_lookup)")


@dataclass(frozen=True)
class DrafterOptions:
    """mask_token_id: the `[MASK]` id, for a checkpoint whose config has none (any Llama/Qwen2/Qwen3 model);
    prompt_lookup: where mask slots give no draft, draft the continuation of the last 2-gram's earlier
    occurrence in the prompt or output, as `wedlm_prompt_lookup` does in transformers; forward_scale: the tokens a
    step carries for the price of its fixed part (`cost.forward_scale`), instead of the device type's."""

    mask_token_id: int | None = None
    prompt_lookup: bool = False
    forward_scale: int | None = None

    def __post_init__(self):
        if self.mask_token_id is not None and (
            isinstance(self.mask_token_id, bool) or not isinstance(self.mask_token_id, int) or self.mask_token_id < 0
        ):
            raise ValueError(f"mask_token_id must be a token id (an int >= 0), got {self.mask_token_id!r}")
        if not isinstance(self.prompt_lookup, bool):
            raise ValueError(f"prompt_lookup must be True or False, got {self.prompt_lookup!r}")
        if self.forward_scale is not None and (
            isinstance(self.forward_scale, bool) or not isinstance(self.forward_scale, int) or self.forward_scale < 1
        ):
            raise ValueError(f"forward_scale must be an int >= 1 (tokens), got {self.forward_scale!r}")

    def class_name(self) -> str:
        """`WeDLMDrafter` followed by one `__` segment per option that differs from its default."""
        segments = [DRAFTER_CLASS]
        if self.mask_token_id is not None:
            segments.append(f"mask_token_id_{self.mask_token_id}")
        if self.prompt_lookup:
            segments.append("prompt_lookup")
        if self.forward_scale is not None:
            segments.append(f"forward_scale_{self.forward_scale}")
        return "__".join(segments)

    @classmethod
    def from_class_name(cls, name: str) -> "DrafterOptions":
        """The options a class name spells; ValueError naming the segment it cannot read."""
        head, *segments = name.split("__")
        if head != DRAFTER_CLASS:
            raise ValueError(f"{name!r} is not a WeDLM drafter name (it must start with {DRAFTER_CLASS!r})")
        values: dict = {}
        for segment in segments:
            match = _SEGMENT.fullmatch(segment)
            if match is None:
                known = ", ".join(field.name for field in fields(cls))
                raise ValueError(f"unknown WeDLM drafter option {segment!r} in {name!r}; options: {known}")
            if match[1]:
                values[match[1]] = int(match[2])
            else:
                values["prompt_lookup"] = True
        return cls(**values)


def speculative_config(
    num_speculative_tokens: int = DEFAULT_SLOTS,
    mask_token_id: int | None = None,
    prompt_lookup: bool = False,
    forward_scale: int | None = None,
) -> dict:
    """vLLM's `speculative_config` for WeDLM drafting: `LLM(model=path, speculative_config=speculative_config())`.

    `num_speculative_tokens` bounds the draft tokens (real drafts plus mask slots) one request adds to a forward;
    each request then uses as many as its recent acceptance earns. `mask_token_id` is needed only for a
    checkpoint whose config has none (a `model_type: "wedlm"` config carries it). `forward_scale` sets the cost
    model's scale (tokens per step's fixed cost) instead of the device type's declared one.
    """
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int):
        raise ValueError(f"num_speculative_tokens must be an int >= 2, got {num_speculative_tokens!r}")
    if num_speculative_tokens < 2:
        raise ValueError(
            f"num_speculative_tokens must be >= 2 (one mask slot repeats the next token, the next one drafts), "
            f"got {num_speculative_tokens}"
        )
    options = DrafterOptions(mask_token_id=mask_token_id, prompt_lookup=prompt_lookup, forward_scale=forward_scale)
    return {
        "method": "custom_class",
        "model": f"{DRAFTER_MODULE}.{options.class_name()}",
        "num_speculative_tokens": num_speculative_tokens,
    }
