"""The Hugging Face Space: the Gradio app, lite on a CPU Space, with the local models server on a GPU Space.

The Space holds this repository with this folder's files at its root (README "A Hugging Face Space").
- CPU: configs/config.lite.yaml, every model on hosted inference (secret HUGGINGFACE_ACCESS_TOKEN), no
  models server.
- GPU (torch sees CUDA): models_server.py starts beside the app and configs/config.gradio.yaml runs hybrid,
  local models first, hosted inference otherwise.
With no OPENAI_API_KEY secret, each visitor enters their own LLM key in Settings (kept in their session only).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE if (HERE / "hugginggpt").is_dir() else HERE.parent  # the Space's root, or spaces/ in a checkout
sys.path.insert(0, str(ROOT))

LITE = "configs/config.lite.yaml"
GPU = "configs/config.gradio.yaml"


def has_gpu() -> bool:
    try:
        import torch
    except ImportError:  # the lite requirements have no torch
        return False
    return bool(torch.cuda.is_available())


def app_args(gpu: bool, env: dict[str, str]) -> list[str]:
    """run_gradio_demo.py's arguments for this hardware; Spaces says where to listen in GRADIO_SERVER_*."""
    return ["--config", str(ROOT / (GPU if gpu else LITE)), "--visitor-keys",
            "--host", env.get("GRADIO_SERVER_NAME", "0.0.0.0"), "--port", env.get("GRADIO_SERVER_PORT", "7860")]


def start_models_server(config: str) -> subprocess.Popen:
    """models_server.py beside the app (loopback only); returns once it answers /running."""
    import requests

    from hugginggpt.config import load_config

    proc = subprocess.Popen([sys.executable, str(ROOT / "models_server.py"), "--config", str(ROOT / config)], cwd=ROOT)
    url = load_config(ROOT / config, need_llm=False).models_server_url
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if requests.get(url + "/running", timeout=2).ok:
                return proc
        except requests.RequestException:
            time.sleep(1)
    raise SystemExit(f"the models server did not start at {url}; running on hosted inference needs the lite config")


def main() -> int:
    from hugginggpt.gradio_ui.launch import main as launch

    gpu = has_gpu()
    server = start_models_server(GPU) if gpu else None
    print(f"HuggingGPT Space on {'GPU: local models server + hosted inference' if gpu else 'CPU: hosted inference'}",
          flush=True)
    try:
        return launch(app_args(gpu, dict(os.environ)))
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    sys.exit(main())
