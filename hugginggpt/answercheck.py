"""The final answer held to the results: every file named exactly as served, no file the request did not make,
and every failed task reported as failed.

Why: a small model writing the answer drops a path's folder (`ab12.png` for `/images/ab12.png`), invents a
plausible one (`/images/cat.png`), or calls a task that failed "done". The person reads the answer, not the
log, so what it says about files and failures is checked against the results after the LLM wrote it, on
every backend: a path it invented is replaced by the file the request made (where only one fits) or marked,
and a file or a failure it left out is added in a line of its own.
"""

from __future__ import annotations

import re
from typing import Any

from .backends.normalize import FILE_KEYS

# A path of the kind the servers serve, as a model may write it: a folder of ours and a file name with a suffix.
SERVED = re.compile(r"(?<![\w/.-])/?(?:public/)?(images|audios|videos)/([A-Za-z0-9][A-Za-z0-9._-]{0,127}\.[A-Za-z0-9]+)")
FAILURE_WORDS = re.compile(r"\b(fail\w*|could not|couldn't|cannot|can't|unable|error\w*|did not work)\b", re.I)


def files_made(results: dict[int, dict[str, Any]]) -> list[tuple[int, str, str]]:
    """(task id, task type, path) of every file the tasks made, in task order."""
    out = []
    for tid in sorted(results):
        inference = results[tid].get("inference result") or {}
        for key in FILE_KEYS:
            if isinstance(inference.get(key), str) and inference[key]:
                out.append((tid, str(results[tid].get("task", {}).get("task", "?")), inference[key]))
    return out


def failures(results: dict[int, dict[str, Any]]) -> list[tuple[int, str, str]]:
    out = []
    for tid in sorted(results):
        error = (results[tid].get("inference result") or {}).get("error")
        if error is not None:
            message = error.get("message", error) if isinstance(error, dict) else error
            out.append((tid, str(results[tid].get("task", {}).get("task", "?")), str(message)))
    return out


def check_answer(message: str, results: dict[int, dict[str, Any]]) -> str:
    """The answer with its file names and failures made true to `results` (unchanged when they already are)."""
    made = files_made(results)
    real = {path for _, _, path in made}

    def fix(match: re.Match[str]) -> str:
        path = f"/{match.group(1)}/{match.group(2)}"
        if path in real:
            return path  # `public/images/x.png` or `images/x.png`: the path as served
        same_kind = [p for p in real if p.startswith(f"/{match.group(1)}/")]
        if len(same_kind) == 1:
            return same_kind[0]
        return f"{match.group(0)} [no such file was made]"

    checked = SERVED.sub(fix, message)
    extra = []
    missing = [(tid, task, path) for tid, task, path in made if path not in checked]
    if missing:
        extra.append("Files made: " + "; ".join(f"{path} (task {tid}, {task})" for tid, task, path in missing))
    failed = failures(results)
    if failed and not FAILURE_WORDS.search(checked):
        extra += [f"Task {tid} ({task}) failed: {why[:300]}" for tid, task, why in failed]
    return checked + ("\n\n" + "\n".join(extra) if extra else "")
