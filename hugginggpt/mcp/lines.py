"""Each line an MCP client sends over stdio, checked before the SDK's session sees it.

The SDK's stdio transport hands its session a line it cannot read as an exception, and the session drops it:
a client that sent 100,000 nested brackets, a lone UTF-16 surrogate or two messages on one line waited for an
answer that never came. Here such a line is answered at once with a JSON-RPC error (the spec's codes, and the
request's id when the line still tells it), and the session only ever sees lines it can read. A line longer
than the server takes (`max_body_bytes`, as over HTTP) is skipped without being held in memory.

`checked_stdio_server` is the SDK's `stdio_server` with this check in front of it (the SDK still claims
stdout; stdin is claimed here the same way: fd 0 points at the null device while the server runs).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, BinaryIO

import anyio
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import ErrorData, JSONRPCError, jsonrpc_message_adapter

log = logging.getLogger(__name__)

PARSE_ERROR = -32700  # JSON-RPC 2.0: the line is not JSON
INVALID_REQUEST = -32600  # JSON, but not a message this server can take
MAX_REPLIES = 100  # errors answered for one line of several messages (the ids past these get none)
MAX_DEPTH = 100  # levels of arrays and objects a message may nest (the SDK's parser stops short of 200)
TOO_DEEP = f"the message is nested too deeply to read; keep it under {MAX_DEPTH} levels of arrays and objects"
CHUNK = 1 << 20  # an oversized line is skipped this many bytes at a time
# JSON tokens, for reading the top-level "id" of a line too deep (or too long) to parse: a string (one cut
# short runs to the end of the line), a bracket or separator, or a bare word (number, true, false, null)
TOKEN = re.compile(r'"(?:[^"\\]|\\.)*(?:"|\Z)|[{}\[\]:,]|[^\s"{}\[\]:,]+', re.DOTALL)

RequestId = int | str


def usable_id(value: Any) -> RequestId | None:
    """An id to answer with: an integer or a string (that can be written back as UTF-8); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return None
        return value
    return None


def top_level_id(text: str) -> RequestId | None:
    """The `"id"` member of the line's top-level object, read token by token without parsing what is nested
    (which may be too deep, or cut short); None when the line is not an object or has no usable id."""
    depth, key, expect_key = 0, None, False
    for match in TOKEN.finditer(text):
        token = match.group()
        if depth == 0 and token != "{":
            return None
        if token in ("{", "["):
            if depth == 1 and key == "id":
                return None  # an object or array as the id
            depth += 1
            expect_key = depth == 1
            continue
        if token in ("}", "]"):
            depth -= 1
            if depth == 0:
                return None
            continue
        if depth != 1 or token == ":":
            continue
        if token == ",":
            expect_key, key = True, None
        elif expect_key:
            try:
                key = json.loads(token)
            except ValueError:
                key = None
            expect_key = False
        elif key == "id":
            try:
                return usable_id(json.loads(token))
            except ValueError:
                return None
    return None


def error(ident: RequestId | None, code: int, message: str) -> JSONRPCError:
    return JSONRPCError(jsonrpc="2.0", id=ident, error=ErrorData(code=code, message=message))


def _several(line: str) -> list[Any] | None:
    """The JSON values of a line that holds more than one, or None when some part of it is not JSON."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(line) and line[at] in " \t\r\n":
            at += 1
        if at == len(line):
            return values
        try:
            value, at = decoder.raw_decode(line, at)
        except (ValueError, RecursionError):
            return None
        values.append(value)


def _lone_surrogate(value: Any) -> str | None:
    """The first lone UTF-16 surrogate in the decoded message (as \\udxxx), or None."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"\\u{ord(exc.object[exc.start]):04x}"
    return None


def _depth(value: Any) -> int:
    """How deeply arrays and objects nest in a decoded value (a scalar: 0)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in children)
    return deepest


def check_line(line: str) -> list[JSONRPCError]:
    """The errors to answer `line` with; none when the SDK can read it (or it is blank, which is skipped)."""
    if not line.strip():
        return []
    try:
        jsonrpc_message_adapter.validate_json(line, by_name=False)
        return []
    except ValueError as exc:  # pydantic's ValidationError: its first problem, on one line
        problems = getattr(exc, "errors", lambda **_: [])(include_url=False)
        reason = " ".join(str(problems[0]["msg"]).split()) if problems else "not a JSON-RPC 2.0 message"
    try:
        value = json.loads(line)
    except RecursionError:
        return [error(top_level_id(line), INVALID_REQUEST, TOO_DEEP)]
    except ValueError as exc:
        several = _several(line) if isinstance(exc, json.JSONDecodeError) and exc.msg == "Extra data" else None
        if several is None:
            where = f" at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
            return [error(None, PARSE_ERROR, f"parse error: the line is not JSON ({getattr(exc, 'msg', exc)}"
                          f"{where}); send one JSON-RPC message per line")]
        ids = [i for v in several if isinstance(v, dict) and "method" in v
               and (i := usable_id(v.get("id"))) is not None][:MAX_REPLIES]
        message = f"{len(several)} JSON values on one line; send each JSON-RPC message on a line of its own"
        return [error(i, INVALID_REQUEST, message) for i in ids] or [error(None, INVALID_REQUEST, message)]
    ident = usable_id(value.get("id")) if isinstance(value, dict) else None
    surrogate = _lone_surrogate(value)
    if surrogate:
        return [error(ident, INVALID_REQUEST, f"the message holds a lone UTF-16 surrogate ({surrogate}), which is "
                      "not a character; send text as valid Unicode")]
    if _depth(value) > MAX_DEPTH:  # deeper than the SDK's parser goes, not as deep as Python's
        return [error(ident, INVALID_REQUEST, TOO_DEEP)]
    if isinstance(value, list):
        return [error(None, INVALID_REQUEST, "a JSON array is a batch, which MCP does not take; send each "
                      "JSON-RPC message on a line of its own")]
    if not isinstance(value, dict):
        return [error(None, INVALID_REQUEST, f"a JSON-RPC message is a JSON object, got {type(value).__name__}")]
    return [error(ident, INVALID_REQUEST, f"not a JSON-RPC 2.0 message: {reason[:300]}")]


def _claimed_stdin() -> Iterator[BinaryIO]:
    """The protocol's stdin, read from a private copy of fd 0 while fd 0 points at the null device (so nothing
    else in the process, or a child it starts, reads the client's bytes); fd 0 comes back on exit."""
    try:
        private = os.dup(0)
    except OSError:  # no descriptor to move: read it in place
        yield sys.stdin.buffer
        return
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        # never closed: the reader thread may still be blocked on it when the server stops
        yield os.fdopen(private, "rb", closefd=False)
    finally:
        os.dup2(private, 0)


claimed_stdin = contextmanager(_claimed_stdin)  # wrapped, not decorated: mutmut skips decorated functions


class CheckedLines:
    """The lines of `stream` the SDK can read, as text; every other line is answered through `errors`."""

    def __init__(self, stream: BinaryIO, max_line_bytes: int, errors: Any):
        self.stream = stream
        self.max_line_bytes = max_line_bytes
        self.errors = errors

    def _read(self) -> tuple[bytes, bool]:
        """(the next line, whether it was longer than max_line_bytes: then only its start); b"" at the end."""
        line = self.stream.readline(self.max_line_bytes + 1)
        if len(line) <= self.max_line_bytes or line.endswith(b"\n"):
            return line, False
        rest = line
        while rest and not rest.endswith(b"\n"):  # skip the rest of it without keeping it
            rest = self.stream.readline(CHUNK)
        return line[:CHUNK], True

    async def __aiter__(self) -> AsyncIterator[str]:
        while True:
            raw, too_long = await anyio.to_thread.run_sync(self._read)
            if not raw:
                return
            line = raw.decode("utf-8", errors="replace")  # as the SDK reads it
            if too_long:
                errors = [error(top_level_id(line), INVALID_REQUEST, f"the message is larger than this server "
                                f"takes ({self.max_line_bytes} bytes, max_body_bytes)")]
            else:
                errors = check_line(line)
            if not errors:
                yield line
                continue
            log.warning("MCP stdio: answered a line of %d bytes with %s", len(raw),
                        errors[0].error.message if len(errors) == 1 else f"{len(errors)} errors")
            for reply in errors:
                await self.errors.send(reply)


async def _checked_stdio_server(max_line_bytes: int) -> AsyncIterator[tuple[Any, Any]]:
    """(read stream, write stream) for an MCP server session, as the SDK's `stdio_server` gives them, with
    every line checked first (`check_line`)."""
    send_errors, errors = anyio.create_memory_object_stream[JSONRPCError](MAX_REPLIES)

    async def answer(write_stream: Any) -> None:
        async with errors:
            async for reply in errors:
                try:
                    await write_stream.send(SessionMessage(reply))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return

    with claimed_stdin() as stdin:
        async with send_errors:
            lines = CheckedLines(stdin, max_line_bytes, send_errors)
            async with stdio_server(stdin=lines) as (read_stream, write_stream):  # type: ignore[arg-type]
                async with anyio.create_task_group() as tg:
                    tg.start_soon(answer, write_stream)
                    yield read_stream, write_stream
                    tg.cancel_scope.cancel()


checked_stdio_server = asynccontextmanager(_checked_stdio_server)  # wrapped: mutmut skips decorated functions
