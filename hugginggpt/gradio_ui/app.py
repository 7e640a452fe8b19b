"""The Blocks UI: chat with text, images and audio; the plan live; outputs inline; settings and cancel per visitor.

Everything a visitor owns (conversation, LLM settings, running request, files) is kept per browser session,
on the server: gr.State for the conversation, the settings and the public paths of the session's files,
`ActiveRuns` (owned by the app object, keyed by the session) for the request to cancel, and `VisitorFiles`
for the files in Gradio's folders (what the browser uploaded, the outputs it was shown). Nothing of theirs is
kept in module globals, logged, shown back or left in the browser; a file is used as input, or served, only
for the visitor whose it is.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import gradio as gr

from ..errors import HuggingGPTError
from ..taskprogress import describe as progress_words
from .orchestrators import Orchestrator, Run, UserError, VisitorLLM, size_text
from .progress import COLUMNS, Progress, describe, files_of, task_title
from .sessions import VisitorFiles, visitor_of

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_DIR = ROOT / "public" / "examples"
EXAMPLES = [
    ("Describe this picture, then read the description aloud.", "chelsea.jpg"),
    ("Which objects are in this photo? Draw boxes around them.", "coffee.jpg"),
    ("Classify this image and generate a new picture in the same style.", "astronaut.jpg"),
    ("Transcribe this recording and say what it is about.", "speech.wav"),
    ("Draw a red rocket flying over a snowy mountain, then describe your drawing.", None),
]
API_TYPES = ["openai", "azure", "local"]
# A file an orchestrator stored or made, as a request names it (`/uploads/<32 hex>.png`, also `uploads/…`,
# `public/uploads/…`, %-encoded or with backslashes): a session may name only its own.
SESSION_FILE = re.compile(r"(uploads|images|audios|videos)/([0-9a-f]{32}\.[a-z0-9]{1,8})", re.IGNORECASE)
CSS = """
#plan table { font-size: 0.85em; }
.gradio-container { max-width: 1400px !important; }
"""


class ActiveRuns:
    """The running request of each browser session, so that session's Cancel stops it (and no other)."""

    def __init__(self) -> None:
        self._runs: dict[str, Run] = {}
        self._lock = threading.Lock()

    def put(self, session: str, run: Run) -> None:
        with self._lock:
            old = self._runs.pop(session, None)
            self._runs[session] = run
        if old is not None:
            old.cancel()

    def drop(self, session: str, run: Run) -> None:
        with self._lock:
            if self._runs.get(session) is run:
                del self._runs[session]

    def cancel(self, session: str) -> bool:
        with self._lock:
            run = self._runs.pop(session, None)
        if run is None:
            return False
        run.cancel()
        return True


def example_inputs() -> list[dict[str, Any]]:
    return [{"text": text, "files": [str(EXAMPLES_DIR / name)] if name else []} for text, name in EXAMPLES
            if name is None or (EXAMPLES_DIR / name).is_file()]


def file_message(path: Path, label: str) -> dict[str, Any]:
    return {"role": "assistant", "content": {"path": str(path), "alt_text": label}}


def error_line(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": f"⚠️ {' '.join(str(text).split())[:500]}"}


def named_files(text: str) -> list[str]:
    """The public paths of stored or generated files that a request's text names (`/uploads/ab….png`)."""
    plain = unquote(text).replace("\\", "/")
    return list(dict.fromkeys(f"/{m.group(1).lower()}/{m.group(2).lower()}" for m in SESSION_FILE.finditer(plain)))


class Conversation:
    """One request's turn in the chat: the messages shown, kept in step with the events."""

    def __init__(self, orchestrator: Orchestrator, chat: list[dict[str, Any]], show=None):
        self.orchestrator = orchestrator
        self.chat = chat
        self.show = show or (lambda local: local)  # a generated file -> the copy this visitor's browser may load
        self.progress = Progress()
        self.pending: dict[int, int] = {}  # task id -> index of its message in the chat
        self.files: list[str] = []
        self.answer_at: int | None = None
        self.answer = ""
        self.outcome = "running"

    def _answer_message(self) -> dict[str, Any]:
        if self.answer_at is None:
            self.chat.append({"role": "assistant", "content": ""})
            self.answer_at = len(self.chat) - 1
        return self.chat[self.answer_at]

    def _task_message(self, event: dict[str, Any], content: str, status: str) -> None:
        tid = int(event.get("id", -1))
        row = self.progress.row(event)
        metadata = {"title": task_title(event, row.model), "status": status}
        if row.seconds is not None:
            metadata["duration"] = float(row.seconds)
        message = {"role": "assistant", "content": content, "metadata": metadata}
        if tid in self.pending:
            self.chat[self.pending[tid]] = message
        else:
            self.chat.append(message)
            self.pending[tid] = len(self.chat) - 1

    def handle(self, event: dict[str, Any]) -> None:
        self.progress.update(event)
        name = event.get("event")
        if name == "task_started":
            self._task_message(event, "running…", "pending")
        elif name == "task_progress":  # its words in the task's message; the bar is Gradio's own (submit)
            self._task_message(event, f"running… {progress_words(event)}", "pending")
        elif name == "task_finished":
            result = event.get("result")
            self._task_message(event, describe(result) or "done", "done")
            for path in files_of(result):
                local = self.orchestrator.local_file(path)
                shown = self.show(local) if local is not None and path not in self.files else None
                if shown is not None:
                    self.files.append(path)
                    self.chat.append(file_message(shown, f"{path} from task #{event.get('id')}"))
        elif name == "task_failed":
            what = "skipped" if event.get("skipped") else "failed"
            self._task_message(event, f"{what}: {event.get('error') or 'no reason given'}", "done")
        elif name == "answer_token":
            message = self._answer_message()
            message["content"] += str(event.get("text", ""))
        elif name == "answer":
            self.answer = str(event.get("message", ""))
            self._answer_message()["content"] = self.answer
            self.outcome = "answered"
        elif name == "error":
            self.outcome = "error"
            self.chat.append(error_line((event.get("error") or {}).get("message", "the request failed")))
        elif name == "cancelled":
            self.outcome = "cancelled"
            self.chat.append({"role": "assistant", "content": "Cancelled."})

    def history_entry(self) -> str:
        """The assistant turn kept for the next request: the answer, naming the files (for "make it bigger")."""
        return self.answer + ("\nGenerated files: " + ", ".join(self.files) if self.files else "")


def read_upload(path: str, limit: int) -> bytes:
    file = Path(path)
    if file.stat().st_size > limit:
        raise UserError(f"{file.name} is larger than {size_text(limit)}")
    return file.read_bytes()


def build_app(orchestrator: Orchestrator, *, title: str = "HuggingGPT", max_upload_bytes: int = 10 * 1024 * 1024,
              concurrency: int | None = None, note: str = "", files: VisitorFiles | None = None):
    """The Gradio Blocks app; `launch.py` launches it (theme and css go to `launch`, as Gradio 6 wants), with
    `sessions.launch_options(files)`: the middleware that records uploads and keeps files to their owners.

    `concurrency` bounds the chat events Gradio runs at once (None: no bound of Gradio's own; an in-process
    engine's admission refuses a run past `max_concurrent_requests` at once, rather than Gradio queueing it)."""
    runs = ActiveRuns()
    files = files if files is not None else VisitorFiles()
    table_value = {"headers": COLUMNS, "data": []}

    def plan_value(progress: Progress) -> dict[str, Any]:
        return {"headers": COLUMNS, "data": progress.table()}

    def refused(chat: list[dict[str, Any]], why: str, box: Any) -> tuple:
        """The chat with one readable line added for this turn (not kept: the next turn starts clean of it)."""
        return chat + [error_line(why)], gr.skip(), gr.skip(), gr.skip(), box, gr.skip()

    def submit(message: dict[str, Any] | None, chat: list[dict[str, Any]] | None, history: list[dict[str, str]] | None,
               llm: VisitorLLM | None, mine: set[str] | None, request: gr.Request,
               progress: gr.Progress = gr.Progress()) -> Iterator[tuple]:  # noqa: B008 - Gradio's own idiom
        chat, history = list(chat or []), list(history or [])
        mine = set(mine or ())
        message = message or {}
        text = str(message.get("text") or "").strip()
        paths = [str(p) for p in message.get("files") or []]
        cleared = {"text": "", "files": []}
        visitor = visitor_of(request)
        if not text and not paths:
            yield refused(chat, "Type a request (and attach images or audio if it needs them).", cleared)
            return
        if orchestrator.needs_llm_settings and not (llm and (llm.api_key or llm.api_endpoint)):
            yield refused(chat, "This app has no LLM of its own: open Settings, enter your API key (and endpoint "
                                "for a local or Azure LLM), then Save.", message)
            return
        foreign = [p for p in paths if not files.allowed(visitor, p)]
        if foreign:  # a path from someone else's session, sent by hand: never read, never stored
            yield refused(chat, f"Upload refused: {Path(foreign[0]).name} was not uploaded from this browser; "
                                "attach the file again.", {"text": text, "files": []})
            return
        others = [p for p in named_files(text) if p not in mine]
        if others:
            yield refused(chat, f"{others[0]} is not a file of this session: attach it again (a session may use "
                                "only the files it uploaded or its requests made).", message)
            return
        named = []
        try:
            for p in paths:
                public, kind = orchestrator.upload(read_upload(p, max_upload_bytes), Path(p).name)
                named.append((p, public, kind))
                mine.add(public.lower())
        except (UserError, OSError) as exc:
            yield refused(chat, f"Upload refused: {exc}", message)
            return
        content = text + "".join(f"\n(attached {kind}: {public})" for _, public, kind in named)
        chat.append({"role": "user", "content": text or "(files attached)"})
        chat += [{"role": "user", "content": {"path": p, "alt_text": public}} for p, public, _ in named]
        try:
            run = orchestrator.start(history + [{"role": "user", "content": content}], llm or VisitorLLM())
        except (UserError, HuggingGPTError) as exc:  # bad settings, or every slot taken: the box kept for a retry
            yield refused(chat, str(exc), message)[:5] + (mine,)
            return
        session = request.session_hash or ""
        runs.put(session, run)

        def show(local: Path) -> str | None:
            """A generated file, copied into Gradio's folder for this visitor (and no one else) to load."""
            try:
                cached = chatbot.move_resource_to_block_cache(str(local))
            except (OSError, ValueError):  # gone before it could be shown: the task's text still is
                log.warning("could not show %s", local.name)
                return None
            files.own(visitor, cached)
            return cached

        turn = Conversation(orchestrator, chat, show)
        try:  # from the first yield: a visitor who leaves before any event stops the request too
            yield turn.chat, turn.chat, history, table_value, cleared, mine
            for event in run:
                turn.handle(event)
                if event.get("event") == "task_progress":  # Gradio's bar: the task that reported last
                    fraction = event.get("fraction")
                    progress(fraction if isinstance(fraction, (int, float)) else None,
                             desc=f"#{event.get('id')} {event.get('task', '')}: {progress_words(event)}")
                mine.update(p.lower() for p in turn.files)
                yield turn.chat, turn.chat, history, plan_value(turn.progress), cleared, mine
        finally:
            runs.drop(session, run)
            run.cancel()  # the visitor left (or the event was stopped): the request stops too
        if turn.outcome == "answered":
            history += [{"role": "user", "content": content}, {"role": "assistant", "content": turn.history_entry()}]
        yield turn.chat, turn.chat, history, plan_value(turn.progress), cleared, mine

    def cancel(request: gr.Request) -> str:
        return "Cancelling…" if runs.cancel(request.session_hash or "") else ""

    def save_settings(api_type: str, api_key: str, endpoint: str, llm: VisitorLLM | None) -> tuple:
        from ..llm import check_api_key, check_request_endpoint

        key = (api_key or "").strip() or (llm.api_key if llm else None)
        endpoint = (endpoint or "").strip() or None
        try:
            if key:
                check_api_key(key)
            if endpoint:
                endpoint = check_request_endpoint(endpoint)
        except HuggingGPTError as exc:
            return llm, "", f"⚠️ {exc}"
        if not key and not endpoint:
            return llm, "", "⚠️ Enter an API key (or, for a keyless local LLM, its endpoint)."
        saved = VisitorLLM(api_key=key, api_type=api_type or None, api_endpoint=endpoint)
        where = f" at {endpoint}" if endpoint else ""
        return saved, "", f"Saved for this browser session only: {api_type}{where}, key {'set' if key else 'none'}."

    def forget() -> tuple:
        return None, "", "Settings cleared for this session."

    with gr.Blocks(title=title, delete_cache=(3600, 86400)) as demo:  # visitors' files leave Gradio's cache
        history = gr.State([])  # what the LLM sees of the conversation: text, files named
        shown = gr.State([])  # what the chat shows: this session's, kept on the server
        llm_state = gr.State(None)  # the visitor's LLM settings: on the server only, never sent to the browser
        mine = gr.State(set())  # the public paths of the files this session uploaded or its requests made
        gr.Markdown(f"## {title}\nAsk in plain language; attach images or audio. An LLM plans the request as "
                    "tasks, picks a Hugging Face model for each, runs them and writes the answer." +
                    (f"\n\n{note}" if note else ""))
        with gr.Row(equal_height=False):
            with gr.Column(scale=3, min_width=320):
                chatbot = gr.Chatbot(label="Conversation", elem_id="chat", height=560, buttons=["copy"],
                                     placeholder="Your conversation appears here.")
                box = gr.MultimodalTextbox(placeholder="Ask HuggingGPT… (attach images or audio with the clip)",
                                           file_types=["image", "audio"], file_count="multiple",
                                           sources=["upload", "microphone"], show_label=False, elem_id="input",
                                           stop_btn=True)
                with gr.Row():
                    cancel_btn = gr.Button("Cancel", variant="stop", elem_id="cancel", size="sm")
                    clear_btn = gr.Button("New conversation", elem_id="clear", size="sm")
                    cancel_status = gr.Markdown("", elem_id="cancel-status")
                gr.Examples(examples=example_inputs(), inputs=[box], label="Examples (files in public/examples)",
                            elem_id="examples")
            with gr.Column(scale=2, min_width=300):
                plan = gr.Dataframe(value=table_value, label="Plan (live)", interactive=False, elem_id="plan",
                                    wrap=True, column_widths=["27%", "7%", "8%", "33%", "13%", "12%"], buttons=[])
                with gr.Accordion("Settings: your LLM", open=orchestrator.needs_llm_settings, elem_id="settings"):
                    gr.Markdown("Kept in this browser session only: never logged, never shown back, never shared."
                                if orchestrator.needs_llm_settings else
                                "Optional: this app has an LLM. Your own settings apply to your session only.")
                    api_type = gr.Dropdown(API_TYPES, value="openai", label="API type", elem_id="api_type")
                    api_key = gr.Textbox(label="API key", type="password", elem_id="api_key")
                    api_endpoint = gr.Textbox(label="Endpoint (local or Azure LLM)", elem_id="api_endpoint",
                                              placeholder="http://localhost:8006/v1")
                    with gr.Row():
                        save = gr.Button("Save", elem_id="save", size="sm")
                        forget_btn = gr.Button("Forget", elem_id="forget", size="sm")
                    settings_status = gr.Markdown("", elem_id="settings-status")

        chat_event = box.submit(submit, [box, shown, history, llm_state, mine],
                                [chatbot, shown, history, plan, box, mine], api_name="chat",
                                concurrency_limit=concurrency)
        for trigger in (cancel_btn.click, box.stop):
            trigger(cancel, None, cancel_status, api_name="cancel" if trigger == cancel_btn.click else False,
                    concurrency_limit=None, queue=False)
        chat_event.then(lambda: "", None, cancel_status, api_name=False, queue=False)
        save.click(save_settings, [api_type, api_key, api_endpoint, llm_state], [llm_state, api_key, settings_status],
                   api_name="save_settings", concurrency_limit=None)
        forget_btn.click(forget, None, [llm_state, api_key, settings_status], api_name="forget_settings")
        clear_btn.click(cancel, None, cancel_status, api_name=False, queue=False) \
            .then(lambda: ([], [], [], table_value), None, [chatbot, shown, history, plan], api_name="clear",
                  queue=False)
    files.public_from_config(demo.config)  # the examples, cached at build: the same for every visitor
    return demo
