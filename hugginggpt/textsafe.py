"""Text from outside (an LLM's reply, a plan it wrote) made safe to pass on.

JSON can carry a lone UTF-16 surrogate (`\\ud800`) that no UTF-8 consumer downstream accepts (the next prompt,
an event, a log line, the models server's request): such a code point becomes U+FFFD.
"""

from __future__ import annotations

import json
import re

# JSON with non-ASCII text as it is (json.dumps(..., ensure_ascii=False)), for prompts and references; a module
# constant, so mutmut's equivalent `ensure_ascii=None` is no mutant
JSON_AS_IS = json.JSONEncoder(ensure_ascii=False)

LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    return LONE_SURROGATE.sub("\ufffd", text)


CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]+")


def one_line(text: str) -> str:
    """`text` as one line of plain text: each run of control characters (line breaks, tabs, escape sequences a
    terminal would obey) becomes one space. For words a peer wrote that a client shows on one line (a progress
    line, a task's error in the CLI)."""
    return CONTROL.sub(" ", text)
