"""`make run` / `make cli`: the HuggingGPT server (or terminal chat) with the config, or the offline demo when no
LLM is configured.

    python tools/start.py [--config configs/config.default.yaml] [--port 8004] [--mode server|cli]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/config.default.yaml")
    parser.add_argument("--port", type=int, default=8004)
    parser.add_argument("--mode", choices=["server", "cli"], default="server")
    args = parser.parse_args(argv)
    from hugginggpt.config import load_config
    from hugginggpt.errors import ConfigError, NoLLMConfigured

    try:
        config = load_config(args.config)
        missing = config.llm.api_type is None
        reason = "the config names no LLM backend and OPENAI_API_KEY is not set"
    except NoLLMConfigured as exc:
        config, missing, reason = None, True, str(exc)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if args.mode == "server":  # before anything slow: a taken port is one line, at once
        from hugginggpt.checks import taken_port_line

        host = "127.0.0.1" if missing or config is None else config.http_host
        taken = taken_port_line(host, args.port, "tools/start.py")
        if taken:
            print(taken, file=sys.stderr)
            return 2
    if missing:
        print(f"no LLM configured ({reason}): export OPENAI_API_KEY=sk-..., or run `make run "
              "CONFIG=configs/config.local.yaml` with your vLLM/Ollama/llama.cpp server in local.endpoint; "
              "starting the offline demo instead", file=sys.stderr, flush=True)
        demo = [sys.executable, str(ROOT / "tools" / "demo.py")]
        os.execv(sys.executable, demo + (["--cli"] if args.mode == "cli" else ["--port", str(args.port)]))
    command = [sys.executable, str(ROOT / "awesome_chat.py"), "--config", args.config, "--mode", args.mode]
    os.execv(sys.executable, command + (["--port", str(args.port)] if args.mode == "server" else []))
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
