"""`folder:file.gguf` names, and GGUF files dequantized once to a plain checkpoint: transformers refuses to save or
fine-tune a GGUF-loaded model, and dequantizing takes most of a minute."""

import functools
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .atomic import save_atomically

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def split_gguf(name: str) -> tuple[str, str | None]:
    """`folder:file.gguf` -> (folder, file.gguf); anything else -> (name, None)."""
    folder, separator, file = name.rpartition(":")
    if separator and file.endswith(".gguf"):
        return folder, file
    return name, None


@functools.cache
def dequantized_copy(folder: str, gguf: str) -> Path:
    """A folder with the GGUF model dequantized to a plain fp32 checkpoint and its tokenizer.

    The copy is kept under the temp dir, keyed by the file's size and mtime, so later loads on the machine take
    seconds. It is written atomically (concurrent loads are safe).
    """
    stat = (Path(folder) / gguf).stat()
    cache = Path(tempfile.gettempdir()) / f"wedlm-hf-{Path(gguf).stem}-{stat.st_size}-{stat.st_mtime_ns}"
    if (cache / "config.json").exists():
        return cache
    dequantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    config = dequantized.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(dequantized.state_dict())
    save_atomically(model, tokenizer, cache)
    return cache
