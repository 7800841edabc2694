"""One way to turn a model name the user typed into a loaded model and tokenizer, for every command.

A name is a local folder or Hub id (what `from_pretrained` takes), `folder:file.gguf` (a GGUF file inside a
folder), one of the short names in `NAMED_MODELS`, or a local PEFT adapter folder (`wedlm-hf finetune --lora-r`):
its base (any of the above, e.g. `smollm2`) is loaded and a whole-model adapter merged into it (a draft-only one
attached, gated to mask slots), and the adapter folder's
tokenizer and generation config (mask token, WeDLM defaults) are the ones used. `pretrained_path` gives code that
loads by path itself (the server, the Hub export) a folder plain `from_pretrained` reads.

`names` turns a name into a path (and refuses an unknown one at once), `gguf` dequantizes GGUF files, `load` loads.
"""

from .gguf import SMOLLM2_GGUF, dequantized_copy, split_gguf
from .load import ADAPTER_CONFIG, load_adapter, load_model_and_tokenizer, pretrained_path
from .names import DEFAULT_NAME, MODEL_HELP, NAMED_MODELS, UnknownModelError, resolve

__all__ = [
    "ADAPTER_CONFIG",
    "DEFAULT_NAME",
    "MODEL_HELP",
    "NAMED_MODELS",
    "SMOLLM2_GGUF",
    "UnknownModelError",
    "dequantized_copy",
    "load_adapter",
    "load_model_and_tokenizer",
    "pretrained_path",
    "resolve",
    "split_gguf",
]
