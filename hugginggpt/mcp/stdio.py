"""The MCP server over stdio, for desktop agent hosts that start it as a subprocess.

stdout carries the protocol and nothing else: logs, warnings and config errors go to stderr. Every line the
client sends is checked before the SDK's session reads it (`lines.py`): one it cannot read is answered with a
JSON-RPC error, never dropped without a word. The tools draw on the engine's one admission
(`max_concurrent_requests`), as every other door does.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

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
        anyio.run(serve, server, config.max_body_bytes)
    except KeyboardInterrupt:
        pass
    return 0


async def serve(server: MCPServer, max_line_bytes: int) -> None:
    """`server.run("stdio")`, with each line checked first (the SDK's `run_stdio_async`, on our transport)."""
    from .lines import checked_stdio_server

    lowlevel = server._lowlevel_server  # noqa: SLF001 - the session runner run_stdio_async uses
    async with checked_stdio_server(max_line_bytes) as (read_stream, write_stream):
        await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
