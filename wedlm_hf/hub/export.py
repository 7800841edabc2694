"""Hub-ready folders that need no `wedlm_hf` install on the loading side.

transformers' remote code loads a model's modules from its own folder and resolves only relative imports between
files of that folder. So the package's `modeling/` and `generation/` modules are copied side by side into the
folder, with their cross-package imports (`from ..generation.cache import`) rewritten to sibling imports
(`from .cache import`); they import nothing but torch and transformers.
"""

import importlib.util
import json
import re
import shutil
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

import wedlm_hf.generation
import wedlm_hf.modeling

AUTO_MAP = {
    "AutoConfig": "configuration_wedlm.WeDLMConfig",
    "AutoModel": "modeling_wedlm.WeDLMModel",
    "AutoModelForCausalLM": "modeling_wedlm.WeDLMForCausalLM",
}
_CROSS_PACKAGE_IMPORT = re.compile(r"^(\s*from\s+)\.\.(?:modeling|generation)\.", flags=re.MULTILINE)
_CUSTOM_GENERATE = '''"""WeDLM parallel decoding as a Hub `custom_generate` recipe.

`model.generate(custom_generate=<this repo>, trust_remote_code=True, ...)` calls `generate` below with every
argument of that call; transformers' own `generate` then prepares the inputs, processors and stopping criteria and
hands the loop to the local `wedlm_decode`.
"""

from transformers import GenerationMixin

from .mixin import bind_generate_kwargs


def generate(model, **kwargs):
    decode, kwargs = bind_generate_kwargs(model.generation_config, kwargs)
    return GenerationMixin.generate(model, custom_generate=decode, **kwargs)
'''


def hub_config_dir() -> Path:
    """The folder of shipped checkpoint configs: package data `wedlm_hf.hub_configs`, or the source tree's."""
    spec = importlib.util.find_spec("wedlm_hf.hub_configs")
    if spec is not None:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parents[2] / "hub_configs"


HUB_CONFIG_NAMES = tuple(sorted(path.parent.name for path in hub_config_dir().glob("*/config.json")))


def copy_remote_modules(target: Path) -> list[str]:
    """Write every module of `wedlm_hf.modeling` and `wedlm_hf.generation` flat into `target`; return the names."""
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for package in (wedlm_hf.modeling, wedlm_hf.generation):
        for source in sorted(Path(package.__file__).parent.glob("*.py")):
            if source.name == "__init__.py":
                continue
            if source.name in written:
                raise ValueError(f"two packages define {source.name}; remote-code modules must have unique names")
            (target / source.name).write_text(_CROSS_PACKAGE_IMPORT.sub(r"\1.", source.read_text()))
            written.append(source.name)
    return written


def _add_auto_map(config_file: Path) -> None:
    config = json.loads(config_file.read_text())
    config["auto_map"] = AUTO_MAP
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _model_card(title: str, has_weights: bool) -> ModelCard:
    data = ModelCardData(library_name="transformers", pipeline_tag="text-generation", tags=["wedlm", "custom_code"])
    weights = "" if has_weights else "\nThis folder holds the configuration and code only; add the weights next to them.\n"
    return ModelCard(
        f"---\n{data.to_yaml()}\n---\n\n# {title}\n\n"
        "A causal LM decoded with WeDLM streaming parallel decoding (arXiv 2512.22737): several tokens per forward, "
        "standard causal attention and a prefix KV cache.\n"
        f"{weights}\n## Usage\n\n```python\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        f'model = AutoModelForCausalLM.from_pretrained("{title}", trust_remote_code=True)\n'
        f'tokenizer = AutoTokenizer.from_pretrained("{title}", trust_remote_code=True)\n'
        'inputs = tokenizer("def fibonacci(n):", return_tensors="pt")\n'
        'output = model.generate(**inputs, decoding="wedlm", max_new_tokens=64, return_dict_in_generate=True)\n'
        "print(tokenizer.decode(output.sequences[0]), output.wedlm_stats.summary())\n```\n\n"
        '`decoding="ar"` gives ordinary autoregressive decoding. The model code in this folder was exported by '
        "`wedlm-hf export` and needs only torch and transformers.\n"
    )


def export_model_folder(
    target: str | Path,
    *,
    config_name: str | None = None,
    model: PreTrainedModel | str | Path | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> Path:
    """Write a remote-code model folder: config with `auto_map`, generation config, modules, model card, and the
    weights (and tokenizer) of `model` when one is given, else the shipped config `config_name`."""
    if (config_name is None) == (model is None):
        raise ValueError("pass exactly one of `config_name` (a shipped config) or `model` (a model or its path)")
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    if config_name is not None:
        if config_name not in HUB_CONFIG_NAMES:
            raise ValueError(f"unknown config {config_name!r}; shipped configs: {', '.join(HUB_CONFIG_NAMES)}")
        for name in ("config.json", "generation_config.json"):
            shutil.copyfile(hub_config_dir() / config_name / name, target / name)
        title = config_name
    else:
        if not isinstance(model, PreTrainedModel):
            tokenizer = tokenizer or _tokenizer_at(Path(model))
            model = AutoModelForCausalLM.from_pretrained(model)
        if model.config.model_type != "wedlm":
            raise ValueError(f"only WeDLM models (model_type 'wedlm') can be exported, got {model.config.model_type!r}")
        model.save_pretrained(target)
        if tokenizer is not None:
            tokenizer.save_pretrained(target)
        title = target.name
    _add_auto_map(target / "config.json")
    copy_remote_modules(target)
    _model_card(title, has_weights=model is not None).save(target / "README.md")
    return target


def _tokenizer_at(path: Path) -> PreTrainedTokenizerBase | None:
    return AutoTokenizer.from_pretrained(path) if (path / "tokenizer_config.json").exists() else None


def export_custom_generate(target: str | Path) -> Path:
    """Write a `custom_generate` repo: `custom_generate/generate.py` and the modules it imports, plus a card."""
    target = Path(target)
    code = target / "custom_generate"
    copy_remote_modules(code)
    (code / "generate.py").write_text(_CUSTOM_GENERATE)
    data = ModelCardData(library_name="transformers", tags=["custom_generate", "wedlm"])
    ModelCard(
        f"---\n{data.to_yaml()}\n---\n\n# WeDLM decoding (`custom_generate`)\n\n"
        "WeDLM streaming parallel decoding for decoder-only causal LMs with RoPE and full attention in every "
        "layer (Llama, Mistral, Qwen, Gemma, Phi-3, ...) trained for it.\n\n"
        "```python\n"
        'output = model.generate(**inputs, custom_generate="<this repo>", trust_remote_code=True, max_new_tokens=64)\n'
        "```\n\nThe mask token comes from `model.generation_config.mask_token_id` or `model.config.mask_token_id`. "
        "Decoding options (`wedlm_window_size`, `wedlm_entropy_threshold`, `wedlm_pos_penalty_factor`) are read from "
        "the generation config too.\n"
    ).save(target / "README.md")
    return target
