"""Browser demo of WeDLM parallel decoding: WeDLM and autoregressive decoding race side by side.

Only `logic` and `engine` are importable without Gradio; `app` needs the `demo` extra, so that `wedlm-hf` keeps
working on installs without it.
"""
