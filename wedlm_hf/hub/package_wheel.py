"""wedlm-hf itself as a wheel file, for a folder (a Space) that installs the package without PyPI: built by pip from
a checkout, or packed again from the files an installed wheel left in site-packages."""

import base64
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path

import wedlm_hf

DISTRIBUTION = "wedlm-hf"
INSTALL_RECORDS = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}
"""What pip writes into a .dist-info when it installs (RECORD is written anew): no part of the wheel it installed."""


def build_wheel(destination: Path) -> Path:
    """Write the running package's wheel into `destination`; its path. The source is the checkout `wedlm_hf` is
    imported from, else the installed distribution; neither is a clear error."""
    package = Path(wedlm_hf.__file__).resolve().parent
    checkout = package.parent
    with tempfile.TemporaryDirectory() as scratch:
        if (checkout / "pyproject.toml").is_file():
            built = _wheel_from_checkout(checkout, Path(scratch))
        else:
            built = _wheel_from_installed(_installed_distribution(package), Path(scratch))
        destination.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(built, destination / built.name))


def _wheel_from_checkout(checkout: Path, scratch: Path) -> Path:
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(scratch), str(checkout)]
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = list(scratch.glob("wedlm_hf-*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        last_line = (result.stderr.strip().splitlines() or ["no wheel written"])[-1]
        raise OSError(f"pip could not build the wedlm-hf wheel from the checkout {checkout}: {last_line}")
    return wheels[0]


def _installed_distribution(package: Path) -> Distribution:
    """The installed distribution whose files hold the imported `wedlm_hf` package."""
    try:
        installed = distribution(DISTRIBUTION)
    except PackageNotFoundError:
        installed = None
    if installed is None or Path(installed.locate_file("wedlm_hf")).resolve() != package or not installed.files:
        raise FileNotFoundError(
            f"cannot build the wedlm-hf wheel: {package} is neither in a checkout (no pyproject.toml beside it) nor "
            "installed by pip; run from a checkout (`pip install -e .`) or install the package's wheel"
        )
    return installed


def _wheel_from_installed(installed: Distribution, scratch: Path) -> Path:
    """The installed files, without those installing added (scripts, byte code, pip's records), zipped with a
    RECORD of their hashes as the wheel format asks."""
    files = [
        file
        for file in installed.files
        if file.parts[0] != ".."
        and "__pycache__" not in file.parts
        and not (file.parts[0].endswith(".dist-info") and file.name in INSTALL_RECORDS)
    ]
    dist_info = next(file.parts[0] for file in files if file.parts[0].endswith(".dist-info"))
    tag = next(line.split(":", 1)[1].strip() for line in installed.read_text("WHEEL").splitlines() if "Tag:" in line)
    wheel_path = scratch / f"{dist_info.removesuffix('.dist-info')}-{tag}.whl"
    record = []
    with zipfile.ZipFile(wheel_path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for file in files:
            path = Path(installed.locate_file(file))
            data = path.read_bytes()
            wheel.writestr(zipfile.ZipInfo.from_file(path, file.as_posix()), data, zipfile.ZIP_DEFLATED)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{file.as_posix()},sha256={digest},{len(data)}")
        record.append(f"{dist_info}/RECORD,,")
        wheel.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return wheel_path
