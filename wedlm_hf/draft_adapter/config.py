"""A draft-only adapter's PEFT config, and the marker that tells it apart from an ordinary LoRA adapter.

The adapter is saved in PEFT's own format so that PEFT and transformers load it. What makes it draft-only must
survive that round trip, and `adapter_config.json` keys PEFT does not know are dropped (with a warning) on load. So
the marker rides in the one field PEFT keeps and uses verbatim: `target_modules` as a regular expression that
starts with a regex comment, `(?#wedlm_hf draft-only mask_token_id=N)`. PEFT matches module names with it
unchanged; `wedlm_hf` reads the mask id back from it, so even a base model that knows no mask token decodes with
the right one.

The folder's decoding defaults (its generation_config.json's `decoding`, WeDLM options and suppressed tokens) ride
in the same comment, as JSON after `defaults=`, written there whenever wedlm_hf writes that file
(`record_decoding_defaults`): loaded by `PeftModel.from_pretrained(base, folder)` or transformers'
`from_pretrained(folder)`, the model gets its base's generation config and no trace of the folder, so the gate sets
these (`attach.py`) and the adapter decodes as its folder says.
"""

import json
import re
from pathlib import Path

import torch

from ..generation.options import KEYWORDS

MERGE_REFUSED = (
    "a draft-only adapter cannot be merged: merged weights would change the model at every token, not only at mask "
    "slots. Decode with the adapter attached (wedlm_hf.loading, or wedlm_hf.enable on the PEFT model), or train a "
    "whole-model adapter (`wedlm-hf finetune --whole-model`) if you want a merged model."
)
MARKER = "(?#wedlm_hf draft-only mask_token_id={})"
_MARKER_PATTERN = re.compile(r"\(\?#wedlm_hf draft-only mask_token_id=(\d+)(?: defaults=([^)]*))?\)")
DEFAULT_KEYS = ("decoding", "suppress_tokens", *(keyword for keyword in KEYWORDS if keyword != "mask_token_id"))
"""The generation-config keys the marker carries (the mask id it carries anyway)."""


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The distinct names of the `nn.Linear` layers inside the decoder blocks (attention and MLP projections);
    the LM head and embeddings are left out: mask rows never reach them as inputs that need adapting."""
    output = model.get_output_embeddings()
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not output and ".layers." in f".{name}"
    }
    if not names:
        raise ValueError(f"{type(model).__name__}: found no linear layers inside its decoder blocks to adapt")
    return sorted(names)


def draft_only_lora_config(r: int, lora_alpha: int, target_modules: list[str], mask_token_id: int):
    """PEFT `LoraConfig` of a draft-only adapter on `target_modules` (short names, e.g. `q_proj`)."""
    from peft import LoraConfig

    names = "|".join(re.escape(name) for name in target_modules)
    return LoraConfig(
        r=r,
        lora_alpha=lora_alpha,
        target_modules=MARKER.format(int(mask_token_id)) + rf"(?:.*\.)?(?:{names})",
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )


def _marker(config) -> re.Match | None:
    target = config.get("target_modules") if isinstance(config, dict) else getattr(config, "target_modules", None)
    return _MARKER_PATTERN.match(target) if isinstance(target, str) else None


def draft_only_mask_id(config) -> int | None:
    """The mask token id of a draft-only adapter's config (a PEFT config or its dict), else None."""
    found = _marker(config)
    return int(found.group(1)) if found else None


def draft_only_defaults(config) -> dict:
    """The decoding defaults a draft-only adapter's config carries (generation-config keys), else {}."""
    found = _marker(config)
    return json.loads(found.group(2)) if found and found.group(2) else {}


def record_decoding_defaults(folder: str | Path) -> None:
    """Copy the decoding defaults of `folder`'s generation_config.json into its draft-only adapter's marker (a
    folder holding anything else is left alone)."""
    adapter_file, generation_file = Path(folder) / "adapter_config.json", Path(folder) / "generation_config.json"
    if not (adapter_file.is_file() and generation_file.is_file()):
        return
    adapter = json.loads(adapter_file.read_text(encoding="utf-8"))
    found = _marker(adapter)
    if found is None:
        return
    generation = json.loads(generation_file.read_text(encoding="utf-8"))
    defaults = {key: generation[key] for key in DEFAULT_KEYS if key in generation}
    # JSON holds ")" only inside strings, where its escape keeps the regex comment open to its end
    carried = json.dumps(defaults, separators=(",", ":"), sort_keys=True).replace(")", "\\u0029")
    marker = MARKER.format(found.group(1))[:-1] + f" defaults={carried})"
    adapter["target_modules"] = marker + adapter["target_modules"][found.end() :]
    adapter_file.write_text(json.dumps(adapter, indent=2, sort_keys=True) + "\n", encoding="utf-8")
