"""Logging setup for the entry points (library code only ever calls logging.getLogger).

Log lines carry text from clients (a request's words, a URL, a header), so every handler the entry points
install escapes control characters: a newline in a logged value cannot forge a line of its own, and no NUL,
ESC (terminal colours, cursor moves) or other control byte reaches a file or a terminal. A traceback keeps
its lines, each indented under the record that carries it.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from .requestctx import RequestIdFilter

FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"  # "-" outside a request
# C0 controls, DEL, C1 controls and the Unicode line/paragraph separators (some viewers break lines there)
_CONTROLS = [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029]
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
ESCAPES = {c: _NAMED.get(chr(c), f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _CONTROLS}
KEEP_NEWLINES = {c: v for c, v in ESCAPES.items() if c != ord("\n")}


def escape_controls(text: str) -> str:
    """`text` on one line: control characters as Python-style escapes (`\\n`, `\\x1b`, `\\u2028`)."""
    return text.translate(ESCAPES)


class SafeFormatter(logging.Formatter):
    """A Formatter whose records cannot break out of their line."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record))

    def _block(self, text: str) -> str:
        return "\n".join("  | " + line for line in text.translate(KEEP_NEWLINES).split("\n"))

    def formatException(self, ei) -> str:
        return self._block(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return self._block(super().formatStack(stack_info))


def setup_logging(debug: bool = False, log_file: Path | None = None, quiet: bool = False, tag: str = "") -> None:
    """tag: written after the level on every line (a worker process's "w0", "w1": several append to one log)."""
    level = logging.DEBUG if debug else logging.INFO
    handlers: list[logging.Handler] = []
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.WARNING if quiet else level)
    handlers.append(console)
    if log_file:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(SafeFormatter(FORMAT.replace("%(name)s", f"{tag} %(name)s") if tag else FORMAT))
        handler.addFilter(RequestIdFilter())
    logging.basicConfig(level=level, handlers=handlers, force=True)
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2", "openai", "urllib3", "waitress.queue"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
