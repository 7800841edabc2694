"""Upload an exported folder to the Hub with `huggingface_hub`."""

from pathlib import Path

from huggingface_hub import create_repo, upload_folder


def push_folder(
    folder: str | Path, repo_id: str, *, private: bool = False, token: str | None = None, commit_message: str | None = None
) -> str:
    """Create `repo_id` if needed and upload `folder` (an output of `wedlm-hf export`); return the commit URL."""
    folder = Path(folder)
    if not (folder / "config.json").exists() and not (folder / "custom_generate" / "generate.py").exists():
        raise ValueError(f"{folder} is not an exported folder: it has neither config.json nor custom_generate/generate.py")
    create_repo(repo_id, private=private, token=token, exist_ok=True)
    commit = upload_folder(
        folder_path=folder,
        repo_id=repo_id,
        token=token,
        commit_message=commit_message or "Upload WeDLM export",
        ignore_patterns=["__pycache__/*", "*.pyc"],
    )
    return str(commit)
