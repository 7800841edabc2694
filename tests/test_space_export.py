"""`wedlm-hf export DIR --space` as a Space runs it: the folder's requirements.txt installed into a fresh venv (torch
first, from the local disk), `python app.py` started in the folder with the GRADIO_SERVER_* variables a Space sets,
and the page read and one generation run in headless Chromium. Then the venv's own `wedlm-hf`, installed from the
wheel, exports the folder again: the wheel it packs from site-packages holds the same files as the one pip built.

Slow (a venv with torch, transformers and gradio: one to two minutes). Skips only when Playwright, Gradio or the
browser is missing, like tests/test_demo_e2e.py, whose page helpers it uses.
"""

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from huggingface_hub import metadata_load
from local_server import free_port
from patience import PATIENCE_S
from wedlm_hf.hub.space import SPACE_FILES
from test_demo_e2e import CHROMIUM, CHROMIUM_ARGS, PATIENCE_MS, VERDICT, _run, _wait_until_serving, sync_api

REPO = Path(__file__).resolve().parents[1]
OFFLINE = {"HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "PIP_RETRIES": "0"}
"""PIP_RETRIES: the CPU torch index named in requirements.txt cannot be reached here; each package is looked up there
once and then on the local indexes, without pip's retries (seconds each)."""


def _venv_env(venv: Path) -> dict[str, str]:
    """The environment of a shell with `venv` activated and nothing of this checkout on the import path."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, **OFFLINE, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}"}


def _run_checked(command: list, **kwargs) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=PATIENCE_S, **kwargs)
    assert result.returncode == 0, f"{command} exited with {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _wheel_files(wheel: Path) -> dict[str, bytes]:
    """Name -> bytes of each file but RECORD (which lists them, in any order)."""
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist() if not name.endswith(".dist-info/RECORD")}


def test_space_folder_serves_the_demo_from_a_fresh_venv(tmp_path):
    folder, venv = tmp_path / "space", tmp_path / "venv"
    _run_checked([sys.executable, "-m", "wedlm_hf.cli", "export", str(folder), "--space"], cwd=tmp_path)
    (wheel,) = folder.glob("wedlm_hf-*.whl")
    assert sorted(path.name for path in folder.iterdir()) == sorted([*SPACE_FILES, wheel.name])
    front_matter = metadata_load(folder / "README.md")
    demo_extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["demo"]
    assert f"gradio=={front_matter['sdk_version']}" in demo_extra
    assert front_matter["sdk"] == "gradio" and front_matter["app_file"] == "app.py" and front_matter["title"]

    _run_checked([sys.executable, "-m", "venv", str(venv)])
    python, env = str(venv / "bin" / "python"), _venv_env(venv)
    _run_checked([python, "-m", "pip", "install", "-q", "torch==2.13.0"], env=env)
    _run_checked([python, "-m", "pip", "install", "-q", "-r", "requirements.txt"], cwd=folder, env=env)

    port = free_port()
    space_env = {**env, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port), "PYTHONUNBUFFERED": "1"}
    app = subprocess.Popen(
        [python, "app.py"], cwd=folder, env=space_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        url = f"http://127.0.0.1:{port}/"
        _wait_until_serving(app, url)
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url)
            page.locator("#run").wait_for(timeout=PATIENCE_MS)
            assert page.locator('a[href="https://arxiv.org/abs/2512.22737"]').count() == 1
            _run(page)  # the counting prompt the page starts with
            verdict = VERDICT.search(page.locator("#verdict").inner_text())
            assert verdict and float(verdict[2]) > 1 and verdict[3] == "identical to AR", verdict
            browser.close()
    finally:
        app.terminate()
        app.wait(timeout=30)

    imported = _run_checked([python, "-c", "import wedlm_hf; print(wedlm_hf.__file__)"], cwd=tmp_path, env=env)
    assert Path(imported.strip()).is_relative_to(venv), imported  # app.py installed the wheel, not this checkout
    _run_checked([str(venv / "bin" / "wedlm-hf"), "export", str(tmp_path / "again"), "--space"], cwd=tmp_path, env=env)
    (repacked,) = (tmp_path / "again").glob("wedlm_hf-*.whl")
    assert repacked.name == wheel.name and _wheel_files(repacked) == _wheel_files(wheel)
