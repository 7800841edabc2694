"""Shipped config.json / generation_config.json of the public WeDLM checkpoints (package data)."""
