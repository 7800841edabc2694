"""Loading a resolved name: a plain folder or Hub id, a GGUF file (through its dequantized copy) or a PEFT adapter
folder (its base with the adapter merged in)."""

import hashlib
import json
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..peft_compat import peft_deprecations_silenced
from .gguf import dequantized_copy, save_atomically, split_gguf
from .names import resolve


def load_model_and_tokenizer(
    name: str | None, dtype: torch.dtype | str = "auto", **model_kwargs
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (eval mode, not yet WeDLM-enabled) and tokenizer that `name` stands for (see the module docstring)."""
    path = resolve(name)
    if (Path(path).expanduser() / ADAPTER_CONFIG).is_file():
        with peft_deprecations_silenced():
            return load_adapter(Path(path).expanduser(), dtype, **model_kwargs)
    folder, gguf = split_gguf(path)
    if gguf is None:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **model_kwargs)
        return model.eval(), tokenizer
    saved = dequantized_copy(str(Path(folder).expanduser().resolve()), gguf)
    tokenizer = AutoTokenizer.from_pretrained(saved)
    model = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32 if dtype == "auto" else dtype, **model_kwargs)
    return model.eval(), tokenizer


ADAPTER_CONFIG = "adapter_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_adapter(folder: Path, dtype, **model_kwargs) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The adapter's base with the adapter merged in (a plain model again: `enable` and decoding need no PEFT at
    run time), with the adapter folder's tokenizer and generation config."""
    from transformers import GenerationConfig

    try:
        from peft import PeftModel
    except ImportError as error:
        raise ImportError(f"{folder} is a PEFT adapter: loading it needs `pip install peft`") from error
    base_name = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path")
    if not base_name:
        raise ValueError(f"adapter folder {str(folder)!r}: its adapter_config.json names no base model")
    base, base_tokenizer = load_model_and_tokenizer(base_name, dtype=dtype, **model_kwargs)
    model = PeftModel.from_pretrained(base, folder).merge_and_unload()
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
        model.config.mask_token_id = getattr(model.generation_config, "mask_token_id", None)
    # PEFT's own save_pretrained writes no tokenizer; `wedlm-hf finetune` writes the one with the mask token
    has_tokenizer = any((folder / name).is_file() for name in TOKENIZER_FILES)
    return model.eval(), AutoTokenizer.from_pretrained(folder) if has_tokenizer else base_tokenizer


def pretrained_path(name: str | None) -> str:
    """A folder (or Hub id) that plain `from_pretrained` loads as the model `name` stands for, for code that loads
    by path itself (`transformers serve`, the demo's config preview): a GGUF file's dequantized copy, an adapter's
    merged copy (kept under the temp dir, keyed by the sizes and mtimes of the adapter folder's files), else the
    resolved path."""
    path = resolve(name)
    folder, gguf = split_gguf(path)
    if gguf is not None:
        return str(dequantized_copy(str(Path(folder).expanduser().resolve()), gguf))
    adapter = Path(path).expanduser()
    if not (adapter / ADAPTER_CONFIG).is_file():
        return path
    files = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in adapter.iterdir() if f.is_file())
    stamp = hashlib.sha1(repr(files).encode()).hexdigest()[:16]  # a changed generation config is a new copy too
    merged = Path(tempfile.gettempdir()) / f"wedlm-hf-merged-{adapter.name}-{stamp}"
    if not (merged / "config.json").exists():
        with peft_deprecations_silenced():
            save_atomically(*load_adapter(adapter.resolve(), torch.float32), merged)
    return str(merged)
