"""`python -m wedlm_hf.cli`: the `wedlm-hf` command (implemented in the top-level `wedlm_hf_cli` module)."""

from wedlm_hf_cli import main

if __name__ == "__main__":
    raise SystemExit(main())
