"""Smoke test of an installed wheel, as a user runs it (`.ci/run` calls it from a folder outside the checkout).

Not collected by pytest (the name has no `test_` prefix): it checks the installed package, where the test suite
checks the source tree. Each step runs the `wedlm-hf` command of the environment this script runs in.
"""

import importlib
import json
import os
import pkgutil
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PROMPT = "1, 2, 3, 4,"


def wedlm_hf(*args: str, timeout: float = 600) -> str:
    """Run `wedlm-hf ARGS`; its standard output, or exit with what it printed (also on a warning: normal use prints
    none)."""
    command = [shutil.which("wedlm-hf") or sys.exit("no `wedlm-hf` command on PATH"), *args]
    print("$", " ".join(command[:1] + [f"'{a}'" if " " in a else a for a in args]), flush=True)
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0 or "Warning" in result.stderr:
        sys.exit(f"exit status {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result.stdout


def check_installed_not_checkout() -> None:
    import wedlm_hf as package

    location = Path(package.__file__).resolve()
    assert "site-packages" in location.parts, f"wedlm_hf imported from {location}, not from the installed wheel"
    checkpoints = location.parent / "checkpoints"
    shipped = sorted(path.name for path in checkpoints.glob("*/*"))
    assert "model.safetensors" in shipped and "adapter_model.safetensors" in shipped, shipped
    assert not {"training_log.json", "finetune_summary.json"} & set(shipped), f"training logs shipped: {shipped}"
    assert list((location.parent / "hub_configs").glob("*/config.json")), "hub_configs' json files are missing"


def check_license_shipped() -> None:
    from importlib.metadata import distribution

    dist = distribution("wedlm-hf")
    assert dist.metadata["License-Expression"] == "Apache-2.0", dist.metadata["License-Expression"]
    license_file = next((path for path in dist.files if path.parts[-2:] == ("licenses", "LICENSE")), None)
    assert license_file is not None, "LICENSE is not in the wheel's .dist-info/licenses/"
    assert "Apache License" in license_file.read_text() and "END OF TERMS AND CONDITIONS" in license_file.read_text()


def import_every_subpackage() -> None:
    import wedlm_hf as package

    names = [info.name for info in pkgutil.walk_packages(package.__path__, "wedlm_hf.") if info.ispkg]
    for name in names:
        importlib.import_module(name)
    assert "wedlm_hf.continuous" in names, names
    print(f"imported {len(names)} subpackages: {', '.join(names)}", flush=True)


def generate_with_each_embedded_model() -> None:
    for model, extra in (("wedlm-tiny-code", []), ("smollm2-wedlm", ["--lossless"])):
        output = wedlm_hf("generate", "--model", model, *extra, "--max-new-tokens", "8", PROMPT)
        assert output.splitlines()[-1].startswith("[wedlm] ") and " tokens per forward " in output, output


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve_one_request_with_continuous_batching() -> None:
    port = free_port()
    command = [shutil.which("wedlm-hf"), "serve", "wedlm-tiny-code", "--continuous-batching", "--port", str(port)]
    print("$", " ".join(command), flush=True)
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300
        while True:
            if server.poll() is not None:
                sys.exit(f"the server exited with status {server.returncode}:\n{server.stdout.read()}")
            try:
                urllib.request.urlopen(f"{base}/models", timeout=5).read()
                break
            except OSError:
                assert time.monotonic() < deadline, "the server did not answer within 300 s"
                time.sleep(1)
        body = json.dumps({"model": "wedlm-tiny-code", "prompt": PROMPT, "max_tokens": 8}).encode()
        request = urllib.request.Request(f"{base}/completions", body, {"Content-Type": "application/json"})
        answer = json.loads(urllib.request.urlopen(request, timeout=120).read())
        assert answer["choices"][0]["text"], answer
        print(f"served: {answer['choices'][0]['text']!r}", flush=True)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything it runs is shipped in the wheel or its extras
    check_installed_not_checkout()
    check_license_shipped()
    import_every_subpackage()
    generate_with_each_embedded_model()
    serve_one_request_with_continuous_batching()
    assert "--lora-r" in wedlm_hf("finetune", "--help")
    print("wheel smoke test passed", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
