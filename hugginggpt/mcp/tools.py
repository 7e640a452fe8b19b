"""The MCP tools over one HuggingGPT engine: a whole request, its decisions, one model, the catalog.

Every input goes through the code the HTTP routes use (`ChatRequest.from_body`, `search_query`, the plan's
task validation, the URL policy, `allowed_models` / `denied_models`, the upload checks), and every error
reaches the client as an MCP tool error of one line, never a traceback.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import json
import logging
import re
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import AudioContent, CallToolResult, ContentBlock, ImageContent, TextContent, ToolAnnotations
from pydantic import Field, ValidationError

from .. import __version__, cancel
from ..admission import admitted
from ..chat import ChatRequest, HuggingGPT, RequestState, validate_messages
from ..errors import BadRequest, Forbidden, HuggingGPTError
from ..plan import tasks_from_json
from ..request import generated_files, search_query
from ..resources import public_file, resolve, sniff_mime
from ..select import Selection, control_task_fixup
from ..streamwork import StreamWork
from ..uploads import UploadStore
from . import progress as tool_progress

log = logging.getLogger(__name__)

# A Hub id ("org/name") or a bare name: it goes into the backends' URLs, so nothing else gets through.
MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?", re.ASCII)
INSTRUCTIONS = (
    "HuggingGPT: an LLM plans a request as tasks, picks Hugging Face models for them, runs them and answers. "
    "Call `hugginggpt` for a whole request, `plan` to see the tasks and models without running anything, "
    "`run_model` to run one task on a model you name, `search_models` to browse the models it can choose from. "
    "Images and audio go in as http(s) URLs, data: URIs or paths under the server's public/ folder."
)

Text = Annotated[str, Field(description="the request, in words (as a user would write it)")]
ImageArg = Annotated[str | None, Field(description="an input image: http(s) URL, data: URI or /path under public/")]
AudioArg = Annotated[str | None, Field(description="an input audio file: http(s) URL, data: URI or /path under public/")]


def one_line(text: str) -> str:
    return " ".join(str(text).split())


class Tools:
    """What each tool does, as plain calls over the engine (the MCP wiring is in `build_server`)."""

    def __init__(self, engine: HuggingGPT):
        self.engine = engine
        self.config = engine.config
        self.public = self.config.public_dir.resolve()
        self.uploads = UploadStore(self.public, self.config.upload_quota_bytes, self.config.max_image_pixels)

    def admitted(self) -> contextlib.AbstractContextManager[None]:
        """A slot of the engine's one admission (the HTTP routes' too): past max_concurrent_requests a call is
        refused at once."""
        return admitted(self.engine.admission, self.config.max_concurrent_requests)

    # -- inputs --------------------------------------------------------------------------------------

    def attach(self, value: str, kind: str) -> str:
        """An input image or audio (URL fetched under the URL policy, data URI, or public/ path) as a path
        under public/ that the plan can name; what is not already there is checked and kept like an upload."""
        c = self.config
        value = value.strip()  # as `resolve` reads it
        res = resolve(value, self.public, c.max_fetch_bytes, c.fetch_timeout, c.proxy, self.engine.url_policy)
        if res.public_path:
            path, got = res.public_path, res.mime.split("/")[0]
        else:
            # the file name at the end of a URL's path tells what has no magic bytes (an MP3); a data URI has none
            name = (Path(value.split("?")[0]).name if not value.startswith("data:")
                    else ""  # pragma: no mutate: any other name without an extension guesses nothing either
                    )  # (a marker inside the brackets holds for its own line; after them, for the statement's first)
            path, got = self.uploads.store(res.data, name)
        if got != kind:
            raise BadRequest(f"`{kind}` must be {'an image' if kind == 'image' else 'audio'}; got {res.mime}")
        return path

    def request(self, text: str, image: str | None, audio: str | None) -> ChatRequest:
        """The request as /hugginggpt would receive it: the words, then the inputs by their public/ paths."""
        validate_messages([{"role": "user", "content": text}])
        content = text
        for kind, value in (("image", image), ("audio", audio)):
            if value is not None:
                content += f"\n{kind.capitalize()}: {self.attach(value, kind)}"
        return ChatRequest.from_body({"messages": [{"role": "user", "content": content}]})

    # -- outputs -------------------------------------------------------------------------------------

    def media(self, paths: list[str]) -> list[ContentBlock]:
        """Generated images and audio as MCP image/audio content (videos and oversized files stay as paths)."""
        blocks: list[ContentBlock] = []
        for path in paths:
            try:
                file = public_file(path, self.public)
            except HuggingGPTError:
                continue
            if file.stat().st_size > self.config.max_output_bytes:
                continue
            data = file.read_bytes()
            mime = sniff_mime(data, file.name)
            encoded = base64.b64encode(data).decode()
            if mime.startswith("image/"):
                blocks.append(ImageContent(data=encoded, mime_type=mime))
            elif mime.startswith("audio/"):
                blocks.append(AudioContent(data=encoded, mime_type=mime))
        return blocks

    # -- the tools -----------------------------------------------------------------------------------

    def hugginggpt(self, text: str, image: str | None = None, audio: str | None = None) -> CallToolResult:
        request = self.request(text, image, audio)
        holder: dict[str, RequestState] = {}
        with self.admitted():  # the whole pipeline: run's default mode, "answer"
            answer = self.engine.run(request, on_event=tool_progress.events(),
                                     state_ready=lambda s: (holder.setdefault("state", s), watched(s)))
        state = holder["state"]  # handed over before anything runs
        with state.lock:
            results = {tid: state.results[tid] for tid in sorted(state.results)}
        message = str(answer["message"])
        files = generated_files(results)
        plain = _jsonable({str(k): v for k, v in results.items()})
        content: list[ContentBlock] = [TextContent(text=message), *self.media(files)]
        if results:
            content.append(TextContent(text="Task results: " + json_text(plain)))
        return CallToolResult(content=content, structured_content={
            "message": message, "files": files, "results": plain, "request_id": request.request_id})

    def plan(self, text: str, image: str | None = None, audio: str | None = None) -> CallToolResult:
        request = self.request(text, image, audio)
        with self.admitted():
            decided = _jsonable(self.engine.run(request, "decisions", state_ready=watched))
        return CallToolResult(content=[TextContent(text=json_text(decided))], structured_content=decided)

    def run_model(self, task: str, model: str, text: str | None = None, image: str | None = None,
                  audio: str | None = None) -> CallToolResult:
        """One task on a named model, run the way a plan's task runs (the same executor, URL policy, deadline,
        allowed/denied models), on the first configured backend that has the model."""
        args = {k: v for k, v in dict(text=text, image=image, audio=audio).items() if v is not None}
        if not args:
            raise BadRequest("give the model its input: `text`, `image` or `audio`")
        if any("<GENERATED>" in v.upper() for v in args.values()):
            raise BadRequest("run_model takes its inputs as they are; `<GENERATED>-N` names the output of a "
                             "planned task, which a single model run has none of")
        planned = tasks_from_json([{"task": task, "args": args}]).tasks[0]  # id 0, no dependency
        if planned.error:
            raise BadRequest(planned.error)
        control_task_fixup(planned)
        model = model.strip()
        if not MODEL_ID.fullmatch(model) or ".." in model:
            raise BadRequest(f"`model` must be a model id such as google/vit-base-patch16-224, got {model[:100]!r}")
        selector = self.engine.selector
        if not selector.permitted(model):
            raise Forbidden(f"{model} is not permitted here (allowed_models / denied_models)")
        order = selector.backends_in_order()
        with self.admitted():  # the status checks of a caller-named id are work too
            found = self.engine.availability.check([model], order)
            backend = next((b for b in order if model in found[b]), None)
            if backend is None:
                where = " or ".join("the local models server" if b == "local" else "hosted inference" for b in order)
                raise BadRequest(f"{model} is not available on {where}")
            # the run's request: its id names it in the log; nothing reads its words (no LLM is asked)
            request = ChatRequest(messages=[  # pragma: no mutate: nothing reads the words
                {"role": "user", "content": f"run {planned.task} on {model}"},  # pragma: no mutate: ditto
            ])
            state = RequestState(request, self.engine.llm_for(request), tool_progress.events(),
                                 self.config.request_timeout)
            chosen: Future = Future()
            chosen.set_result(Selection(planned.id, planned.task, model, backend, "named by the caller"))
            state.selections[planned.id] = chosen
            watched(state)
            running = cancel.CURRENT.set(state.cancel_token)  # its I/O stops if the caller leaves
            where = {"id": planned.id, "task": planned.task}
            state.emit("task_started", where)  # its start and its end, as a planned task's are reported
            try:
                record = self.engine.executor.run_task(state, planned)
            finally:
                cancel.CURRENT.reset(running)
            state.emit("task_failed" if "error" in record["inference result"] else "task_finished", where)
        inference = record["inference result"]
        if "error" in inference:  # the executor's failures are {"error": {"message": ...}}
            raise HuggingGPTError(f"{model} ({backend}) failed: {inference['error']['message']}")
        plain = _jsonable(record)
        files = generated_files({planned.id: record})
        content: list[ContentBlock] = [TextContent(text=json_text(plain["inference result"])), *self.media(files)]
        return CallToolResult(content=content, structured_content={**plain, "hosted_on": backend, "files": files})

    def search_models(self, task: str | None, q: str, limit: int) -> CallToolResult:
        task_name, q, limit = search_query(task, q, limit, self.engine.selector.tasks())
        cards = _jsonable(self.engine.selector.search(task_name, q, limit))
        return CallToolResult(content=[TextContent(text=json_text(cards))], structured_content={"models": cards})


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def json_text(value: Any) -> str:
    """JSON as a person reads it: accented letters and other scripts as they are, not \\u escapes."""
    return json.dumps(value,
                      ensure_ascii=False,  # pragma: no mutate: ensure_ascii=None is as false as False
                      )


def guarded(name: str, fn: Callable[..., CallToolResult]) -> Callable[..., CallToolResult]:
    """Errors this package raises on purpose become tool errors of one line; anything else is logged here
    with its traceback and reaches the client as one line naming only its type."""

    def call(*args: Any) -> CallToolResult:
        try:
            return fn(*args)
        except HuggingGPTError as exc:  # the SDK logs it (one line, at INFO)
            raise ToolError(one_line(str(exc))) from None
        except Exception as exc:
            log.exception("MCP tool %s failed", name)
            raise ToolError(f"internal error ({exc.__class__.__name__}); see the server log") from None

    return call


class HuggingGPTServer(MCPServer):
    """An MCPServer whose argument errors read as one line (`text`: Field required), not pydantic's report."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if not isinstance(cause, ValidationError):
                raise
            # the arguments are always an object, so each error's place starts with the argument's name
            problems = "; ".join(f"`{'.'.join(str(p) for p in e['loc'])}`: {e['msg']}" for e in cause.errors())
            raise ToolError(f"Error executing tool {name}: {one_line(problems)}") from cause


CALL: contextvars.ContextVar[StreamWork | None] = contextvars.ContextVar("mcp_call", default=None)


def watched(state: RequestState) -> None:
    """The tool call's client leaving cancels `state` (over HTTP, `mount` watches the connection)."""
    work = CALL.get()
    if work is not None:
        work.state_ready(state)


def _call_of(ctx: Context | None, calls: Callable[[Any], StreamWork | None] | None) -> Iterator[None]:
    """The running call's StreamWork (found by `calls` from its HTTP request) for the block, in `CALL`."""
    work = calls(ctx) if calls is not None and ctx is not None else None
    token = CALL.set(work)
    try:
        yield
    finally:
        CALL.reset(token)


call_of = contextlib.contextmanager(_call_of)  # wrapped, not decorated: mutmut skips decorated functions


def reporting(ctx: Context | None, call: Callable[[], CallToolResult]) -> CallToolResult:
    """`call`, its tasks' progress sent as MCP progress notifications (the SDK sends none unless the client gave
    a progress token)."""
    if ctx is None:
        return call()
    return tool_progress.run_reporting(call, ctx.report_progress)


def build_server(engine: HuggingGPT, calls: Callable[[Any], StreamWork | None] | None = None) -> MCPServer:
    """The four tools over `engine`, for either transport. calls: the StreamWork of a tool call from its
    Context (MCP over HTTP: cancelled when the client leaves); None over stdio."""
    tools = Tools(engine)
    server = HuggingGPTServer("hugginggpt", title="HuggingGPT", version=__version__, instructions=INSTRUCTIONS)
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    hugginggpt_call = guarded("hugginggpt", tools.hugginggpt)
    plan_call = guarded("plan", tools.plan)
    run_call = guarded("run_model", tools.run_model)
    search_call = guarded("search_models", tools.search_models)

    @server.tool(name="hugginggpt", title="Ask HuggingGPT")
    def hugginggpt(text: Text, image: ImageArg = None, audio: AudioArg = None, ctx: Context | None = None) \
            -> CallToolResult:
        """Run a whole request: plan it as tasks, pick a model for each, run them and write the answer. Returns
        the answer, the generated images and audio, and every task's result (as JSON text)."""
        with call_of(ctx, calls):
            return reporting(ctx, lambda: hugginggpt_call(text, image, audio))

    @server.tool(name="plan", title="Plan without running", annotations=read_only)
    def plan(text: Text, image: ImageArg = None, audio: AudioArg = None, ctx: Context | None = None) \
            -> CallToolResult:
        """The decisions only: the tasks the request needs and the model chosen for each, with the reasons
        and the other candidates. Nothing is run."""
        with call_of(ctx, calls):
            return plan_call(text, image, audio)

    @server.tool(name="run_model", title="Run one model")
    def run_model(
        task: Annotated[str, Field(description="the task type, e.g. image-classification, text-to-image")],
        model: Annotated[str, Field(description="the model id, e.g. google/vit-base-patch16-224")],
        text: Annotated[str | None, Field(description="the text input")] = None,
        image: ImageArg = None,
        audio: AudioArg = None,
        ctx: Context | None = None,
    ) -> CallToolResult:
        """Run one task on the model you name, through the server's backends (local models server and/or
        hosted inference), under the same URL policy, allowed models and limits as a planned task."""
        with call_of(ctx, calls):
            return reporting(ctx, lambda: run_call(task, model, text, image, audio))

    @server.tool(name="search_models", title="Search the model catalog", annotations=read_only)
    def search_models(
        task: Annotated[str | None, Field(description="only models for this task type")] = None,
        q: Annotated[str, Field(description="words that describe what the model should do")] = "",
        limit: Annotated[int, Field(strict=True, description="how many models, 1 to 100")] = 10,
    ) -> CallToolResult:
        """The models the planner can choose from, best first (as GET /models/search)."""
        return search_call(task, q, limit)

    return server
