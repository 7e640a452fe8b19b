"""`python -m hugginggpt.mcp --config ...`: the MCP server over stdio."""

import sys

from .stdio import main

sys.exit(main())
