"""Putting WeDLM on the Hugging Face Hub: remote-code model folders, `custom_generate` recipes, uploads."""

from .export import HUB_CONFIG_NAMES, export_custom_generate, export_model_folder, hub_config_dir
from .push import push_folder

__all__ = ["HUB_CONFIG_NAMES", "export_custom_generate", "export_model_folder", "hub_config_dir", "push_folder"]
