"""Loading a resolved name: a plain folder or Hub id, a GGUF file (through its dequantized copy) or a PEFT adapter
folder (its base with a whole-model adapter merged in, or a draft-only adapter attached and gated)."""

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..draft_adapter import draft_only_mask_id, gate_draft_only_adapters
from .atomic import save_atomically, write_atomically
from .gguf import dequantized_copy, split_gguf
from .names import resolve
from .peft_compat import peft_deprecations_silenced


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
    """The adapter's base with the adapter applied, with the adapter folder's tokenizer and generation config.

    A whole-model adapter is merged in (a plain model again: decoding needs no PEFT at run time). A draft-only
    adapter cannot be: it stays attached, gated to mask slots (`draft_adapter`), so the model is the base model at
    every observed token."""
    from transformers import GenerationConfig

    try:
        from peft import PeftModel
    except ImportError as error:
        raise ImportError(f"{folder} is a PEFT adapter: loading it needs `pip install peft`") from error
    base_name = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path")
    if not base_name:
        raise ValueError(f"adapter folder {str(folder)!r}: its adapter_config.json names no base model")
    base, base_tokenizer = load_model_and_tokenizer(base_name, dtype=dtype, **model_kwargs)
    adapted = PeftModel.from_pretrained(base, folder)
    model = adapted.merge_and_unload() if gate_draft_only_adapters(adapted) is None else adapted.get_base_model()
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
        model.config.mask_token_id = getattr(model.generation_config, "mask_token_id", None)
    # PEFT's own save_pretrained writes no tokenizer; `wedlm-hf finetune` writes the one with the mask token
    has_tokenizer = any((folder / name).is_file() for name in TOKENIZER_FILES)
    return model.eval(), AutoTokenizer.from_pretrained(folder) if has_tokenizer else base_tokenizer


def pretrained_path(name: str | None) -> str:
    """A folder (or Hub id) that plain `from_pretrained` loads as the model `name` stands for, for code that loads
    by path itself (`transformers serve`, the demo's config preview): a GGUF file's dequantized copy, a whole-model
    adapter's merged copy, a draft-only adapter's copy naming its base by a path `from_pretrained` reads (it loads
    through transformers' PEFT integration; `wedlm_hf.enable` gates it), else the resolved path. Copies are kept
    under the temp dir, keyed by the sizes and mtimes of the adapter folder's files."""
    path = resolve(name)
    folder, gguf = split_gguf(path)
    if gguf is not None:
        return str(dequantized_copy(str(Path(folder).expanduser().resolve()), gguf))
    adapter = Path(path).expanduser()
    if not (adapter / ADAPTER_CONFIG).is_file():
        return path
    files = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in adapter.iterdir() if f.is_file())
    stamp = hashlib.sha1(repr(files).encode()).hexdigest()[:16]  # a changed generation config is a new copy too
    adapter_config = json.loads((adapter / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    if draft_only_mask_id(adapter_config) is not None:
        copy = Path(tempfile.gettempdir()) / f"wedlm-hf-draft-{adapter.name}-{stamp}"
        if not (copy / ADAPTER_CONFIG).exists():
            base = pretrained_path(adapter_config.get("base_model_name_or_path"))
            write_atomically(copy, lambda partial: copy_adapter(adapter, partial, base, copy))
        return str(copy)
    merged = Path(tempfile.gettempdir()) / f"wedlm-hf-merged-{adapter.name}-{stamp}"
    if not (merged / "config.json").exists():
        with peft_deprecations_silenced():
            save_atomically(*load_adapter(adapter.resolve(), torch.float32), merged)
    return str(merged)


def copy_adapter(adapter: Path, target: Path, base: str, final: Path) -> None:
    """Write into `target` (to be renamed `final`) a folder that `from_pretrained` loads as base + adapter with the
    adapter's generation config and tokenizer: transformers reads those from the base's folder, so a local base's
    files are linked in beside the adapter's, and the adapter names the folder itself as its base."""
    if Path(base).is_dir():
        for file in Path(base).iterdir():
            if file.is_file():
                os.symlink(file.resolve(), target / file.name)
        base = str(final)
    for file in adapter.iterdir():
        if file.is_file():
            (target / file.name).unlink(missing_ok=True)
            shutil.copy2(file, target / file.name)
    config = json.loads((adapter / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    (target / ADAPTER_CONFIG).write_text(json.dumps({**config, "base_model_name_or_path": base}, indent=2))
