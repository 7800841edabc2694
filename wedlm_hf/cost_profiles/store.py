"""The file of measured forward-cost profiles (`generation/cost_profile.py`), per device and model.

The decoder's modules are exported to the Hub as remote code that touches no file, so the file lives here, in the
installed package, which sets it as the decoder's profile store when `wedlm_hf` is imported (`install`).
"""

import functools
import json
import os
import platform
import tempfile
import warnings
from pathlib import Path

import torch
from transformers import PreTrainedModel

from ..generation import cost_profile
from ..generation.cost_profile import model_fingerprint

PROFILE_FILE_VARIABLE = "WEDLM_HF_FORWARD_COST"
"""The environment variable naming the JSON file of stored profiles, instead of `profile_path`'s default."""


@functools.cache
def device_name(device: torch.device) -> str:
    """The device as a profile is keyed by: an accelerator's product name, a CPU's model name."""
    if device.type == "cuda":
        return f"cuda {torch.cuda.get_device_name(device)}"
    if device.type != "cpu":
        return device.type
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def profile_key(model: PreTrainedModel) -> str:
    """A stored profile's key: the device (a CPU's with the torch threads a forward runs on) and the model."""
    device = device_name(model.device)
    if model.device.type == "cpu":
        device += f", {torch.get_num_threads()} threads"
    return f"{device} | {model_fingerprint(model)}"


def profile_path() -> Path:
    """The JSON file of measured profiles: `$WEDLM_HF_FORWARD_COST`, else `wedlm_hf/forward_cost.json` in the
    Hugging Face cache folder (`$HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`)."""
    if os.environ.get(PROFILE_FILE_VARIABLE):
        return Path(os.environ[PROFILE_FILE_VARIABLE]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(os.environ.get("HF_HOME") or os.path.join(cache, "huggingface")).expanduser() / "wedlm_hf" / (
        "forward_cost.json"
    )


@functools.lru_cache(maxsize=4)
def _parsed(path: Path, stamp: tuple[int, int]) -> dict[str, dict]:
    """The file at `path` as it was when its modification time and size were `stamp`: every `generate()` call
    reads the stored profile, and a file is parsed once per version (another process's `store_profile` replaces
    the file, so its stamp changes)."""
    profiles = json.loads(path.read_text(encoding="utf-8"))
    return profiles if isinstance(profiles, dict) else {}


def stored_profiles() -> dict[str, dict]:
    """Every stored profile by its key (device and model, `cost_profile.profile_key`); an unreadable file counts
    as none stored, with a warning (the next `store_profile` rewrites it). Not to be changed: one parse is shared."""
    path = profile_path()
    try:
        stat = path.stat()
        return _parsed(path, (stat.st_mtime_ns, stat.st_size))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        warnings.warn(f"forward cost profiles in {path} are unreadable ({error}); using none of them")
        return {}


def stored_profile(key: str) -> dict | None:
    """The profile stored under `key`, if any."""
    return stored_profiles().get(key)


def store_profile(key: str, profile: dict) -> Path:
    """Store `profile` under `key` beside the others, atomically (a reader sees the old file or the new one,
    never half of one); returns the file's path."""
    path = profile_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    profiles = stored_profiles() | {key: profile}
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump(profiles, file, indent=1, sort_keys=True)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    return path


class ProfileFile:
    """`cost_profile.ProfileStore` on `profile_path()`, keyed by `profile_key`."""

    def read(self, model: PreTrainedModel) -> dict | None:
        return stored_profile(profile_key(model))

    def write(self, model: PreTrainedModel, profile: dict) -> str:
        return str(store_profile(profile_key(model), profile))

    def location(self) -> str:
        return str(profile_path())


def install() -> None:
    """Make the profile file the decoder's store (`cost_profile.STORE`)."""
    cost_profile.STORE = ProfileFile()
