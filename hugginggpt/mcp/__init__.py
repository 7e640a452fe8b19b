"""HuggingGPT as a Model Context Protocol server: tools `hugginggpt`, `plan`, `run_model`, `search_models`.

    python -m hugginggpt.mcp --config configs/config.default.yaml    # stdio, for desktop agent hosts

and, on the orchestrator, streamable HTTP at `/mcp` (`mount.py`). `tools.py` holds the tools over the engine.
Importing this package imports no MCP SDK and starts nothing.
"""
