"""Hugging Face Space entry point: the `wedlm-hf demo` page, bound where the Space's GRADIO_SERVER_* variables say."""

from wedlm_hf.demo.app import build_app, launch

if __name__ == "__main__":
    launch(build_app())
