"""Logging setup for the entry points (library code only ever calls logging.getLogger)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path


def setup_logging(debug: bool = False, log_file: Path | None = None, quiet: bool = False) -> None:
    level = logging.DEBUG if debug else logging.INFO
    handlers: list[logging.Handler] = []
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.WARNING if quiet else level)
    handlers.append(console)
    if log_file:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    logging.basicConfig(level=level, handlers=handlers, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2", "openai", "urllib3", "waitress.queue"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
