"""FlashAttention-2 against SDPA on a tiny bf16 model: WeDLM windows must reach the kernel as one sequence per row.

The decoder hands FlashAttention explicit `cu_seq_lens_*` (generation/attention.py); without them a reordered
window's non-monotonic positions would be read as packed sequences and the tokens would change.
"""

import importlib.util

import pytest
import torch

from tiny_models import tiny_model, random_prompts

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("flash_attn") is None,
    reason="needs a CUDA device and flash-attn",
)


def wedlm(family: str, attn: str, **inputs) -> torch.Tensor:
    model = tiny_model(family, peak=40, attn=attn).to("cuda", torch.bfloat16)
    inputs = {key: value.cuda() for key, value in inputs.items()}
    return model.generate(**inputs, decoding="wedlm", do_sample=False, max_new_tokens=48).cpu()


@pytest.mark.parametrize("family", ["wedlm", "wedlm-qwen2"])
def test_flash_matches_sdpa_single_row(family):
    input_ids, _ = random_prompts([11], seed=1)
    assert torch.equal(wedlm(family, "flash_attention_2", input_ids=input_ids), wedlm(family, "sdpa", input_ids=input_ids))


@pytest.mark.parametrize("family", ["wedlm", "wedlm-qwen2"])
def test_flash_matches_sdpa_padded_batch(family):
    input_ids, attention_mask = random_prompts([5, 17, 9], seed=2)
    flash = wedlm(family, "flash_attention_2", input_ids=input_ids, attention_mask=attention_mask)
    assert torch.equal(flash, wedlm(family, "sdpa", input_ids=input_ids, attention_mask=attention_mask))
