"""HuggingGPT orchestration server and CLI (JARVIS-compatible entry point).

    python awesome_chat.py --config configs/config.default.yaml --mode server|cli|text [--input "..."]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import Any

from hugginggpt.chat import ChatRequest, HuggingGPT
from hugginggpt.checks import print_start_checks as start_checks
from hugginggpt.config import load_config
from hugginggpt.errors import ConfigError, HuggingGPTError

DEFAULT_CONFIG = "configs/config.default.yaml"
_engines: dict[str, HuggingGPT] = {}
_engines_lock = threading.Lock()


def _engine(config_path: str | None) -> HuggingGPT:
    """One engine per config file, built on first use (never at import)."""
    path = config_path or os.environ.get("HUGGINGGPT_CONFIG", DEFAULT_CONFIG)
    with _engines_lock:
        if path not in _engines:
            _engines[path] = HuggingGPT(load_config(path))
        return _engines[path]


def chat_huggingface(
    messages: list[dict[str, str]],
    api_key: str | None = None,
    api_type: str | None = None,
    api_endpoint: str | None = None,
    return_planning: bool = False,
    return_results: bool = False,
    return_decisions: bool = False,
    *,
    config: str | None = None,
) -> Any:
    """JARVIS's function: what /tasks, /results, /hugginggpt (or its decisions) would return."""
    engine = _engine(config)
    request = ChatRequest.from_body(
        {"messages": messages, "api_key": api_key, "api_type": api_type, "api_endpoint": api_endpoint}
    )
    mode = "tasks" if return_planning else "results" if return_results else "decisions" if return_decisions else "answer"
    return engine.run(request, mode)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="YAML config (default: %(default)s)")
    parser.add_argument("--mode", default="cli", choices=["server", "cli", "text"])
    parser.add_argument("--input", help="the request, for --mode text")
    parser.add_argument("--host", help="override http_listen.host")
    parser.add_argument("--port", type=int, help="override http_listen.port")
    parser.add_argument("--strict", action="store_true", help="an unknown config key is an error, not a warning")
    parser.add_argument("--verbose", action="store_true", help="cli/text: keep library progress bars and warnings")
    args = parser.parse_args(argv)
    if args.mode != "server" and not args.verbose:
        from hugginggpt.cli import quiet_libraries

        quiet_libraries()

    from hugginggpt.logs import setup_logging

    if args.mode == "text" and not args.input:
        print("--mode text needs --input \"your request\"", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config, strict=args.strict)
        for warning in config.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        setup_logging(config.debug, config.log_file, quiet=args.mode != "server")
        if args.mode == "server":  # before building anything: a taken port is a one-line error at once
            from hugginggpt.checks import port_problem

            host, port = args.host or config.http_host, args.port or config.http_port
            problem = port_problem(host, port)
            if problem:
                print(f"error: {host}:{port} {problem}; choose another with --port (or http_listen.port in the "
                      "config)", file=sys.stderr)
                return 2
        engine = HuggingGPT(config)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if args.mode == "server" and config.http_workers > 1:
        from hugginggpt.workers import Supervisor

        return Supervisor(config, host, port).run()
    if args.mode == "server":
        from hugginggpt.server import create_app, serve

        threading.Thread(target=engine.warm, name="warm-ranker", daemon=True).start()
        print(f"HuggingGPT server on http://{host}:{port} (LLM: {config.llm.summary()})", file=sys.stderr, flush=True)
        threading.Thread(target=start_checks, args=(engine,), name="start-checks", daemon=True).start()
        threads = config.http_threads or config.max_concurrent_requests + 16
        return serve(create_app(config, engine), host, port, threads=threads, limits=config.http_limits())
    from hugginggpt.cli import run_cli, run_text

    if args.mode == "text":
        return run_text(engine, args.input)
    return run_cli(engine)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except HuggingGPTError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
