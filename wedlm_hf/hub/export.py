"""Hub-ready folders that need no `wedlm_hf` install on the loading side.

transformers' remote code loads a model's modules from its own folder and resolves only relative imports between
files of that folder. So the modules a folder needs (its entry points and what they import, transitively) are
copied side by side, with their cross-package imports (`from ..generation.cache import`) rewritten to sibling
imports (`from .cache import`); they import nothing but torch and transformers.
"""

import ast
import json
import re
import shutil
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

import wedlm_hf.generation
import wedlm_hf.modeling
from wedlm_hf.generation.support import check_supported
from wedlm_hf.generation.transformers_version import TRANSFORMERS_REQUIREMENT
from wedlm_hf.loading import pretrained_path

from .model_card import custom_generate_card, model_folder_card

AUTO_MAP = {
    "AutoConfig": "configuration_wedlm.WeDLMConfig",
    "AutoModel": "modeling_wedlm.WeDLMModel",
    "AutoModelForCausalLM": "modeling_wedlm.WeDLMForCausalLM",
}
MODEL_ENTRY_MODULES = ("configuration_wedlm.py", "modeling_wedlm.py")
RECIPE_REQUIREMENTS = (f"transformers{TRANSFORMERS_REQUIREMENT}", "torch>=2.4")
"""custom_generate/requirements.txt. transformers checks each line against the installed versions before it runs the
recipe."""

TOKENIZER_LOADING_KEYS = ("is_local", "local_files_only")
"""Keys `save_pretrained` copies from how the tokenizer was loaded; they describe this machine, not the model."""

_CROSS_PACKAGE_IMPORT = re.compile(r"^(\s*from\s+)\.\.(?:modeling|generation)\.", flags=re.MULTILINE)
_CUSTOM_GENERATE = '''"""WeDLM parallel decoding as a Hub `custom_generate` recipe.

`model.generate(custom_generate=<this repo>, trust_remote_code=True, ...)` calls `generate` below with every
argument of that call; transformers' own `generate` then prepares the inputs, processors and stopping criteria and
hands the loop to the local `wedlm_decode`.
"""

from transformers import GenerationMixin

from .mixin import bind_generate_kwargs
from .transformers_version import check_transformers_version

check_transformers_version()


def generate(*args, model, **kwargs):
    """`model` is a keyword: a repository that ships this recipe with its model binds it (`from_pretrained` with
    `trust_remote_code=True` replaces the model's `generate`), and the prompt may still come positionally."""
    if kwargs.get("assistant_model") is not None:  # transformers would drop it on the way to a custom loop
        raise ValueError(
            "WeDLM decoding cannot be combined with `assistant_model` (assisted decoding): drop it, or call "
            "`generate` without this recipe."
        )
    decode, kwargs = bind_generate_kwargs(model.generation_config, kwargs)
    return GenerationMixin.generate(model, *args, custom_generate=decode, **kwargs)
'''


def hub_config_dir() -> Path:
    """The folder of shipped checkpoint configs (package data `wedlm_hf.hub_configs`)."""
    return Path(__file__).resolve().parents[1] / "hub_configs"


HUB_CONFIG_NAMES = tuple(sorted(path.parent.name for path in hub_config_dir().glob("*/config.json")))


def remote_module_sources() -> dict[str, str]:
    """Every module of `wedlm_hf.modeling` and `wedlm_hf.generation` by file name, imports rewritten for a flat
    folder."""
    sources: dict[str, str] = {}
    for package in (wedlm_hf.modeling, wedlm_hf.generation):
        for source in sorted(Path(package.__file__).parent.glob("*.py")):
            if source.name == "__init__.py":
                continue
            if source.name in sources:
                raise ValueError(f"two packages define {source.name}; remote-code modules must have unique names")
            sources[source.name] = _CROSS_PACKAGE_IMPORT.sub(r"\1.", source.read_text())
    return sources


def _sibling_imports(source: str) -> set[str]:
    """File names of the modules `source` imports relatively (`from .cache import`, also inside functions)."""
    return {
        f"{node.module}.py"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
    }


def modules_needed(roots: list[str], sources: dict[str, str]) -> list[str]:
    """The modules `roots` (file names in `sources`) and all they import, directly or through each other, sorted."""
    needed: set[str] = set()
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in needed:
            continue
        if name not in sources:
            raise ValueError(f"remote code imports .{name[:-3]}, which is not a module of wedlm_hf")
        needed.add(name)
        pending.extend(_sibling_imports(sources[name]))
    return sorted(needed)


def copy_remote_modules(target: Path, roots: list[str]) -> list[str]:
    """Write the modules `roots` and those they need into `target`; return their names."""
    target.mkdir(parents=True, exist_ok=True)
    sources = remote_module_sources()
    names = modules_needed(roots, sources)
    for name in names:
        (target / name).write_text(sources[name])
    return names


def _add_auto_map(config_file: Path) -> None:
    config = json.loads(config_file.read_text())
    config["auto_map"] = AUTO_MAP
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _strip_tokenizer_loading_keys(folder: Path) -> None:
    config_file = folder / "tokenizer_config.json"
    if not config_file.exists():
        return
    config = json.loads(config_file.read_text())
    if any(key in config for key in TOKENIZER_LOADING_KEYS):
        for key in TOKENIZER_LOADING_KEYS:
            config.pop(key, None)
        config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _make_world_readable(folder: Path) -> None:
    """Files 0644 and folders 0755: `save_pretrained` may leave weights 0600, which a shared cache or a web server
    serving the folder cannot read."""
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _hub_id(name_or_path: str) -> str | None:
    """`name_or_path` if it names a Hub repository ("org/name") rather than a folder on this machine."""
    if not name_or_path or Path(name_or_path).exists() or name_or_path.count("/") != 1:
        return None
    return name_or_path


def _load(model: PreTrainedModel | str | Path, tokenizer: PreTrainedTokenizerBase | None):
    """The model (loaded if given as a path or Hub id), its tokenizer when there is one, and its Hub id if known."""
    if isinstance(model, PreTrainedModel):
        return model, tokenizer, _hub_id(model.config.name_or_path)
    location = pretrained_path(str(model))  # any name `wedlm_hf.loading` takes: named, GGUF, adapter folder
    if tokenizer is None and (_hub_id(location) or (Path(location) / "tokenizer_config.json").exists()):
        tokenizer = AutoTokenizer.from_pretrained(location)
    return AutoModelForCausalLM.from_pretrained(location), tokenizer, _hub_id(str(model))


def _save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, target: Path) -> None:
    model.save_pretrained(target)
    if tokenizer is not None:
        tokenizer.save_pretrained(target)
        _strip_tokenizer_loading_keys(target)


def export_model_folder(
    target: str | Path,
    *,
    config_name: str | None = None,
    model: PreTrainedModel | str | Path | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    repo_id: str | None = None,
    base_model: str | None = None,
    license: str = "apache-2.0",
) -> Path:
    """Write a remote-code model folder: config with `auto_map`, generation config, modules, model card, and the
    weights (and tokenizer) of `model` when one is given, else the shipped config `config_name`.

    `repo_id` is the Hub repository the folder is meant for (its card's snippet loads from it); `base_model` is
    recorded in the card (a Hub id given as `model` is used when it is not set).
    """
    if (config_name is None) == (model is None):
        raise ValueError("pass exactly one of `config_name` (a shipped config) or `model` (a model or its path)")
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    if config_name is not None:
        if config_name not in HUB_CONFIG_NAMES:
            raise ValueError(f"unknown config {config_name!r}; shipped configs: {', '.join(HUB_CONFIG_NAMES)}")
        for name in ("config.json", "generation_config.json"):
            shutil.copyfile(hub_config_dir() / config_name / name, target / name)
    else:
        model, tokenizer, hub_id = _load(model, tokenizer)
        if model.config.model_type != "wedlm":
            raise ValueError(
                f"only WeDLM models (model_type 'wedlm') can be exported as a model folder, got "
                f"{model.config.model_type!r}; for other models use `--custom-generate --model`."
            )
        _save_model(model, tokenizer, target)
        base_model = base_model or hub_id
    _add_auto_map(target / "config.json")
    copy_remote_modules(target, list(MODEL_ENTRY_MODULES))
    card = model_folder_card(
        repo_id or config_name or target.name,
        has_weights=model is not None,
        license=license,
        base_model=base_model,
        transformers_requirement=TRANSFORMERS_REQUIREMENT,
    )
    card.save(target / "README.md")
    _make_world_readable(target)
    return target


def export_custom_generate(
    target: str | Path,
    *,
    model: PreTrainedModel | str | Path | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    repo_id: str | None = None,
    base_model: str | None = None,
    license: str = "apache-2.0",
) -> Path:
    """Write a `custom_generate` repository in transformers' layout: `custom_generate/generate.py`, the modules it
    imports, `custom_generate/requirements.txt`, and a card.

    With `model` (a supported model, see `check_supported`, or its path or Hub id) the repository also holds that
    model, so `from_pretrained(repo, trust_remote_code=True)` gives a model whose `generate` is WeDLM's.
    """
    target = Path(target)
    code = target / "custom_generate"
    if model is not None:
        model, tokenizer, hub_id = _load(model, tokenizer)
        if model.config.model_type == "wedlm":
            raise ValueError(
                "a WeDLM model needs its own remote code: export it without --custom-generate "
                "(its `generate` takes decoding='wedlm')."
            )
        check_supported(model)
        _save_model(model, tokenizer, target)
        base_model = base_model or hub_id
    copy_remote_modules(code, sorted(_sibling_imports(_CUSTOM_GENERATE)))
    (code / "generate.py").write_text(_CUSTOM_GENERATE)
    (code / "requirements.txt").write_text("".join(f"{line}\n" for line in RECIPE_REQUIREMENTS))
    card = custom_generate_card(
        repo_id or target.name,
        has_model=model is not None,
        license=license,
        base_model=base_model,
        transformers_requirement=TRANSFORMERS_REQUIREMENT,
    )
    card.save(target / "README.md")
    _make_world_readable(target)
    return target
