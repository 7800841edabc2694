"""Upload an exported folder to the Hub with `huggingface_hub`: a model repository, or a Space for a Space folder."""

from pathlib import Path

from huggingface_hub import create_repo, get_token, upload_folder

from .space import is_space_folder


def push_folder(
    folder: str | Path, repo_id: str, *, private: bool = False, token: str | None = None, commit_message: str | None = None
) -> str:
    """Create `repo_id` if needed and upload `folder` (an output of `wedlm-hf export`); return the commit URL."""
    folder = Path(folder)
    space = is_space_folder(folder)
    if not space and not (folder / "config.json").exists() and not (folder / "custom_generate" / "generate.py").exists():
        raise ValueError(
            f"{folder} is not an exported folder: it has neither config.json, custom_generate/generate.py nor a "
            "Space's README.md, app.py and requirements.txt"
        )
    token = token or get_token()
    if token is None:
        raise ValueError("no Hugging Face token: run `hf auth login` or set HF_TOKEN to a token with write access")
    repo_type = "space" if space else "model"
    create_repo(
        repo_id, repo_type=repo_type, space_sdk="gradio" if space else None, private=private, token=token, exist_ok=True
    )
    commit = upload_folder(
        folder_path=folder,
        repo_id=repo_id,
        repo_type=repo_type,
        token=token,
        commit_message=commit_message or "Upload WeDLM export",
        ignore_patterns=["__pycache__/*", "*.pyc"],
    )
    return str(commit)
