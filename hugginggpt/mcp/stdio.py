"""The MCP server over stdio, for desktop agent hosts that start it as a subprocess.

stdout carries the protocol and nothing else: logs, warnings and config errors go to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

DEFAULT_CONFIG = "configs/config.default.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hugginggpt.mcp", description=__doc__)
    parser.add_argument("--config", default=os.environ.get("HUGGINGGPT_CONFIG", DEFAULT_CONFIG),
                        help="YAML config (default: $HUGGINGGPT_CONFIG or %(default)s)")
    parser.add_argument("--strict", action="store_true", help="an unknown config key is an error, not a warning")
    parser.add_argument("--verbose", action="store_true", help="log every request at INFO (to stderr)")
    args = parser.parse_args(argv)

    from ..cli import quiet_libraries
    from ..config import load_config
    from ..errors import ConfigError
    from ..logs import setup_logging

    if not args.verbose:
        quiet_libraries()
    try:
        config = load_config(args.config, strict=args.strict)
        for warning in config.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        setup_logging(config.debug, config.log_file, quiet=not args.verbose)
        from ..chat import HuggingGPT

        engine = HuggingGPT(config)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    from .tools import build_server

    threading.Thread(target=engine.warm, name="warm-ranker", daemon=True).start()
    server = build_server(engine)
    try:
        server.run("stdio")
    except KeyboardInterrupt:
        pass
    return 0
