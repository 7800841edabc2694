"""The demo as a Hugging Face Space folder that runs as it is: README front matter, app.py, the package's wheel and
requirements.txt.

A Space installs requirements.txt before it copies the folder's other files in (its build mounts that one file),
so requirements.txt cannot name the wheel beside it: it lists what the wheel needs, and app.py installs the wheel
itself, without dependencies, when it starts.
"""

import difflib
import re
import string
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement

from ..loading.names import DEFAULT_NAME, EXTRAS, NAMED_MODELS
from .package_wheel import build_wheel

SPACE_FILES = ("README.md", "app.py", "requirements.txt")
CPU_TORCH = ("--extra-index-url https://download.pytorch.org/whl/cpu", "torch==2.13.0")
"""PyPI's torch is the CUDA build, gigabytes a CPU Space never uses; the CPU index's `2.13.0+cpu` is the newer
version to pip (its local label), so pip takes it."""
HUB_ID = re.compile(r"\w[\w.-]*/\w[\w.-]*")
"""`user/name`; `./x` and `../x` are folders."""

APP = string.Template('''"""Hugging Face Space of the wedlm-hf demo, written by `wedlm-hf export --space`.

A Space installs requirements.txt before it copies this folder in, so the wheel beside this file is installed here,
at start (requirements.txt holds its dependencies); the page binds where GRADIO_SERVER_NAME / GRADIO_SERVER_PORT say.
"""

import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

WHEEL = Path(__file__).with_name("$wheel")
VERSION = "$version"
MODEL = $model
RESTARTED = "WEDLM_SPACE_WHEEL_INSTALLED"


def wheel_installed() -> bool:
    try:
        return version("wedlm-hf") == VERSION
    except PackageNotFoundError:
        return False


if __name__ == "__main__":
    if not wheel_installed():
        if os.environ.get(RESTARTED):
            sys.exit(f"installed {WHEEL.name}, yet wedlm-hf {VERSION} is not importable")
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", str(WHEEL)], check=True)
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, RESTARTED: "1"})  # sees the new package
    from wedlm_hf.demo.app import build_app, launch

    launch(build_app(MODEL))
''')

README = string.Template('''---
title: WeDLM parallel decoding
sdk: gradio
sdk_version: $gradio
python_version: "$python"
app_file: app.py
license: $license
---

# WeDLM parallel decoding

WeDLM parallel decoding and autoregressive decoding side by side on `$model`, with the step view of
each forward (`wedlm-hf demo`). Written by `wedlm-hf export --space` from wedlm-hf $version.
''')


def space_model(name: str | None) -> str:
    """`name` (default: the embedded checkpoint) if a Space can load it: a named model, which the wheel ships or
    fetches, or a Hub id; a folder on this machine never reaches the Space."""
    name = DEFAULT_NAME if name is None else name
    if name in NAMED_MODELS or (HUB_ID.fullmatch(name) and not Path(name).expanduser().exists()):
        return name
    near = difflib.get_close_matches(name, NAMED_MODELS, n=1)
    raise ValueError(
        f"--model {name!r}: a Space loads a named model ({', '.join(NAMED_MODELS)}) or a Hub id like 'user/name', "
        "not a folder of this machine (upload that with `wedlm-hf push` and pass its id)"
        + (f"; did you mean {near[0]!r}?" if near else "")
    )


def export_space(directory: str | Path, model: str | None = None, license: str = "apache-2.0") -> Path:
    """Write the Space folder for `model` into `directory` (a wheel left by an earlier export is replaced)."""
    model = space_model(model)
    folder = Path(directory)
    for stale in folder.glob("wedlm_hf-*.whl"):
        stale.unlink()
    wheel = build_wheel(folder)
    extras = {"demo", *EXTRAS.get(model, ("",))[0].split(",")} - {""}
    requirements = wheel_requirements(wheel, extras)
    version = wheel.name.split("-")[1]
    app_model = "None  # the embedded checkpoint" if model == DEFAULT_NAME else repr(model)
    (folder / "app.py").write_text(APP.substitute(wheel=wheel.name, version=version, model=app_model))
    (folder / "requirements.txt").write_text("\n".join([*CPU_TORCH, *requirements]) + "\n")
    (folder / "README.md").write_text(
        README.substitute(
            gradio=_pinned(requirements, "gradio"),
            python=f"{sys.version_info.major}.{sys.version_info.minor}",
            license=license,
            model=model,
            version=version,
        )
    )
    return folder


def wheel_requirements(wheel: Path, extras: set[str]) -> list[str]:
    """The wheel's dependencies with `extras` chosen, as requirement lines without markers (its markers only name
    extras)."""
    with zipfile.ZipFile(wheel) as archive:
        metadata_name = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(metadata_name).decode())
    lines = []
    for line in metadata.get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        marker, requirement.marker = requirement.marker, None
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in extras):
            lines.append(str(requirement))
    return lines


def _pinned(requirements: list[str], name: str) -> str:
    """The release of `name` a `name==X` line pins: a Space's sdk_version must be the gradio the demo was tested on."""
    for line in requirements:
        requirement = Requirement(line)
        if requirement.name == name and str(requirement.specifier).startswith("=="):
            return str(requirement.specifier).removeprefix("==")
    raise ValueError(f"the wheel's demo extra pins no {name} release (`{name}==X`), which a Space's front matter needs")


def is_space_folder(folder: Path) -> bool:
    return all((folder / name).is_file() for name in SPACE_FILES)
