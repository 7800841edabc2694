"""What vLLM needs to know of a model for WeDLM drafting: model_type "wedlm" as a config vLLM can read, the
families admitted, and the mask token id.

A WeDLM checkpoint is a Qwen2.5- or Qwen3-layout model under the standard Qwen weight names (spec section 5), so
vLLM's own Qwen2/Qwen3 classes run it: the config below names the layout's class as its architecture. Its layout
rule is `WeDLMConfig`'s, from the same file (`wedlm_hf/modeling/layout.py`, loaded by its path: `hf_files`).
"""

from huggingface_hub.dataclasses import strict
from transformers import PretrainedConfig
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config

from . import hf_files
from .options import DrafterOptions

layout = hf_files.load("modeling/layout.py")

ADMITTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
)
"""vLLM classes whose forward WeDLM drafting reads: decoder-only, RoPE from the positions, every layer attending
to the whole prefix (the families `wedlm_hf.enable` accepts that vLLM also has)."""


@strict
class WeDLMVllmConfig(Qwen3Config):
    """model_type "wedlm" for vLLM: the Qwen3 config plus `qk_norm` and `mask_token_id`, run by vLLM's
    Qwen3ForCausalLM (q/k norm, no bias) or Qwen2ForCausalLM (q/k/v bias, no norm)."""

    model_type = "wedlm"

    head_dim: int | None = None
    attention_bias: bool | None = None
    qk_norm: bool | None = None
    mask_token_id: int | None = None

    def __post_init__(self, **kwargs):
        layout.apply_layout(self)
        super().__post_init__(**kwargs)
        self.architectures = ["Qwen2ForCausalLM" if self.attention_bias else "Qwen3ForCausalLM"]


def register_config() -> None:
    """Make vLLM read model_type "wedlm" with `WeDLMVllmConfig`. vLLM consults its own table of config classes
    before transformers' Auto classes (and registers the class there itself), so the entry goes into that table:
    it wins over `wedlm_hf`'s `WeDLMConfig` where both packages are imported."""
    from vllm.transformers_utils import config as vllm_config

    vllm_config._CONFIG_REGISTRY["wedlm"] = WeDLMVllmConfig


def check_model(hf_config: PretrainedConfig, architectures: list[str], options: DrafterOptions) -> int:
    """The mask token id WeDLM drafting uses for this model; ValueError (one line, naming the fix) for a family
    it cannot read or a model with no usable mask id."""
    refused = [name for name in architectures if name not in ADMITTED_ARCHITECTURES]
    if refused or not architectures:
        raise ValueError(
            f"WeDLM drafting does not support the architecture {', '.join(refused) or 'none'}; supported: "
            f"{', '.join(ADMITTED_ARCHITECTURES)} and model_type 'wedlm' checkpoints (serve this model without "
            "speculative_config)"
        )
    mask_token_id = options.mask_token_id
    if mask_token_id is None:
        mask_token_id = getattr(hf_config, "mask_token_id", None)
    if mask_token_id is None:
        raise ValueError(
            "this model's config has no mask_token_id: pass wedlm_vllm.speculative_config(mask_token_id=ID), ID a "
            "token the model does not emit (for a WeDLM-adapted model, the one it was trained with)"
        )
    vocab_size = hf_config.get_text_config().vocab_size
    if not 0 <= mask_token_id < vocab_size:
        raise ValueError(f"mask_token_id={mask_token_id} is outside the vocabulary (0..{vocab_size - 1})")
    eos = getattr(hf_config, "eos_token_id", None)
    if mask_token_id in (eos if isinstance(eos, list) else [eos]):
        raise ValueError(f"mask_token_id={mask_token_id} is an eos_token_id of the model: pick one it does not emit")
    return mask_token_id
