"""Stage 3: run the planned tasks on their models, in dependency order, as one request's tasks.

The scheduler decides when a task may start; this module decides what running it means: resolve
`<GENERATED>-N` from the results so far, fetch inputs under the URL policy, call the chosen backend and
fall back to the next candidate, and keep one JARVIS-shaped record per task in the request's state.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any

from . import taskprogress
from .backends import Backend, HostedFailure, TaskInputs, listening_to_attempts, note_attempts, stop_listening
from .catalog.health import Health
from .choose import ready_to_start, selection_at_start
from .config import Config
from .errors import BackendError, ResourceError
from .llm import stage_cap
from .plan import Task
from .request import RequestState, collect_result
from .requestctx import ContextThreadPool
from .resources import Resource, resolve
from .scheduler import DONE, FAILED, TIMEOUT, Outcome, Scheduler, TaskFailed
from .select import Selection
from .textsafe import JSON_AS_IS
from .urlpolicy import UrlPolicy, deadline_scope

log = logging.getLogger(__name__)

# the fewest task threads, whatever max_workers × max_concurrent_requests is: a tuning number, not a contract (a
# round's tasks still run at most max_workers at once); mutmut leaves module-level constants alone
MIN_TASK_THREADS = 32


class Executor:
    def __init__(self, config: Config, backends: dict[str, Backend], url_policy: UrlPolicy,
                 observe_model: Callable[[str, str, bool, float], None] | None = None):
        """observe_model(model, backend, ok, seconds): told of every model call (the server's metrics)."""
        self.config = config
        self.observe_model = observe_model
        self.backends = backends
        self.url_policy = url_policy
        # Task threads are shared by all requests (each round still runs at most max_workers at once): starting
        # threads for every request cost more CPU than the rest of the orchestration (bench/load.py).
        self.health: Health | None = None  # the catalog store's, once open: every model run is recorded there
        # ...of a model the catalog knows: an id a caller names (MCP run_model) adds no row of its own
        self.records_health_of: Callable[[str], bool] = lambda model_id: True
        self.threads = ContextThreadPool(
            max_workers=max(MIN_TASK_THREADS, config.max_workers * config.max_concurrent_requests),
            thread_name_prefix="task")  # a thread dump names them task_N

    def execute(self, state: RequestState, tasks: list[Task], round: Round | None = None) -> dict[int, Outcome]:
        """Run the tasks as one round: a new one, or the round the streamed plan already started."""
        round = round or self.begin(state)
        for task in tasks:
            round.add(task)
        return round.finish()

    def begin(self, state: RequestState) -> Round:
        """A round that takes tasks one by one (the streaming planner adds them as they arrive)."""
        return Round(self, state)

    def run_task(self, state: RequestState, planned: Task, choice: Future | None = None) -> dict[str, Any]:
        """Run `planned` on its chosen model (choice: the round's own choice for it; default the request's)."""
        task = planned.copy()
        try:
            self.resolve_refs(state, task)
        except TaskFailed as exc:
            return collect_result(task, "", {"error": {"message": str(exc)}})
        sel = selection_at_start(state, planned, choice)
        if sel.error or not sel.model_id:
            return collect_result(task, sel.choose(), {"error": {"message": sel.error or "no model selected"}})
        if sel.hosted_on == "llm":
            return collect_result(task, sel.choose(), {"response": self.llm_text_task(state, task)})
        try:
            inputs = self.inputs_for(task)
        except ResourceError as exc:
            return collect_result(task, sel.choose(), {"error": {"message": str(exc)}})
        started = time.perf_counter()
        try:
            return self._run_on_models(state, task, sel, inputs)
        finally:
            with state.lock:
                state.model_seconds[task.id] = time.perf_counter() - started

    def _run_on_models(self, state: RequestState, task: Task, sel: Selection, inputs: TaskInputs) -> dict[str, Any]:
        """The chosen model, then the other available candidates, until one succeeds. A backend whose account was
        refused earlier in this request (another task, an earlier round) is not asked again."""
        tried: list[dict[str, str]] = []
        skipped: dict[str, int] = {}  # backend -> candidates not tried because its account was refused
        for model_id, backend_name in sel.fallbacks():
            # the client left (while the inputs were read, or as a candidate failed): no model runs for nobody;
            # past the request's deadline, no candidate could answer in time (nor should count a failure)
            if state.cancelled.is_set() or time.monotonic() >= state.deadline:
                break
            backend = self.backends.get(backend_name)
            if backend is None:
                continue
            with state.lock:
                refused = backend_name in state.refused
            if refused:
                skipped[backend_name] = skipped.get(backend_name, 0) + 1
                continue
            started = time.perf_counter()
            attempts: list[dict[str, str]] = []  # pragma: no mutate: read only as `attempts or ...`: None is alike
            final = account = False
            listening = listening_to_attempts(_keeper(state, task.id, list(tried)))
            try:
                note_attempts([], {"model": model_id, "hosted_on": backend_name})
                with deadline_scope(state.deadline), \
                        taskprogress.listening(self._progress_relay(state, task, model_id, backend_name)):
                    result = backend.infer(model_id, inputs)  # the request's deadline bounds every read of the call
            except BackendError as exc:
                result = {"error": {"message": str(exc)}}
                if isinstance(exc, HostedFailure):  # which providers were tried, and why each failed
                    attempts = exc.tried
                    final, account = exc.final, exc.account
            finally:
                stop_listening(listening)
            seconds = time.perf_counter() - started
            if account:  # the account was refused: nothing more of this request goes there
                with state.lock:
                    state.refused.setdefault(backend_name, _message(result["error"]))
            if self.observe_model is not None:
                self.observe_model(model_id, backend_name, "error" not in result, seconds)
            # a refused account (bad token, no credits) says nothing about the model's health
            self._record(state, model_id, result, seconds, health=not final)
            if "error" not in result:
                if model_id == sel.model_id:
                    reason = sel.reason
                elif tried:
                    reason = f"fallback after {tried[-1]['model']} failed"
                else:  # the candidates before it were on a backend that refused the account earlier
                    reason = f"fallback: {' and '.join(sorted(skipped))} refused the account earlier in this request"
                choose = {"id": model_id, "reason": reason}
                result = dict(result)
                provider = result.pop("provider", None) if backend_name == "huggingface" else None
                if provider:  # the Inference Provider that served it, after those that failed first
                    tried += result.pop("fallback", {}).get("tried", [])
                    choose.update(hosted_on=backend_name, provider=provider)
                if tried:
                    result = {**result, "fallback": {"tried": tried}}
                return collect_result(task, choose, result)
            if state.cancelled.is_set():  # the client left: the call was stopped, not failed, and nothing follows it
                tried.append({"model": model_id, "hosted_on": backend_name, "error": CANCELLED})
                with state.lock:
                    state.attempts[task.id] = list(tried)
                log.info("[%s] task %s: %s on %s cancelled: the client left", state.request.request_id, task.id,
                         model_id, backend_name)
                break
            tried += attempts or [{"model": model_id, "hosted_on": backend_name, "error": _message(result["error"])}]
            with state.lock:
                state.attempts[task.id] = list(tried)  # what a deadline that cuts this task off still shows
            log.warning("[%s] task %s: %s on %s failed: %s", state.request.request_id, task.id, model_id,
                        backend_name, _message(result["error"]))
            if final and not account:  # the request's deadline ended it: no later candidate has time either
                break
        message = "; ".join(f"{t['model']} ({t['hosted_on']}{', ' + t['provider'] if t.get('provider') else ''}): "
                            f"{t['error']}" for t in tried)
        if skipped:
            names, count = " and ".join(sorted(skipped)), sum(skipped.values())
            if tried:
                message += f"; {count} more {names} candidate(s) not tried for the same reason"
            else:
                with state.lock:
                    why = "; ".join(state.refused[b] for b in sorted(skipped))
                message = f"{count} {names} candidate(s) not tried: the account was refused earlier in this request ({why})"
        if state.cancelled.is_set():
            return collect_result(task, sel.choose(), {"error": {"message": CANCELLED, "tried": tried}})
        if not message:
            message = "no backend"
        return collect_result(task, sel.choose(), {"error": {"message": f"every candidate failed: {message}",
                                                             "tried": tried}})

    def _progress_relay(self, state: RequestState, task: Task, model_id: str,
                        backend_name: str) -> taskprogress.Relay | None:
        """Where the model call's progress goes: `task_progress` events, when anyone listens to this request."""
        if state.on_event is None:
            return None
        where = {"id": task.id, "task": task.task, "model": model_id, "hosted_on": backend_name}
        return taskprogress.Relay(lambda event: state.emit("task_progress", {**where, **event}),
                                  self.config.progress_interval_ms / 1000)

    def _record(self, state: RequestState, model_id: str, result: dict[str, Any], seconds: float,
                health: bool = True) -> None:
        """The model's health: success or failure and latency, kept by the store across restarts. A run cut
        short because the request was cancelled says nothing about the model."""
        failed = "error" in result
        if failed:
            with state.lock:
                state.failed_models.add(model_id)
        if self.health is None or not health or (failed and state.cancelled.is_set()):
            return
        try:
            if not self.records_health_of(model_id):
                return
            self.health.record(model_id, not failed, seconds, _message(result["error"])[:300] if failed else None)
        except Exception:  # noqa: BLE001 - a full disk must not fail the task
            log.exception("recording the health of %s failed", model_id)

    def resolve_refs(self, state: RequestState, task: Task) -> None:
        """Replace `<GENERATED>-N` with task N's output of the argument's kind, just before running."""
        for key, value in list(task.args.items()):
            if "<GENERATED>" not in value:
                continue

            def output_of(n: int, key: str = key) -> str:
                with state.lock:
                    dep = state.results.get(n)
                if dep is None:
                    raise TaskFailed(f"argument {key} needs the output of task {n}, which has none")
                inf = dep["inference result"]
                keys = {"image": ("generated image",), "audio": ("generated audio",), "text": (
                    "generated text", "text", "response", "answer")}[key]
                for k in keys:
                    if isinstance(inf.get(k), str) and inf[k]:
                        return inf[k]
                if key == "text" and inf.get("predicted") is not None:
                    return JSON_AS_IS.encode(inf["predicted"])
                if key in dep["task"]["args"] and "<GENERATED>" not in dep["task"]["args"][key]:
                    return dep["task"]["args"][key]  # JARVIS: fall back to the dependency's own input
                raise TaskFailed(f"argument {key} needs a {key} from task {n}, which produced none")

            task.args[key] = re.sub(r"<GENERATED>-(\d+)", lambda m: output_of(int(m.group(1))), value)

    def inputs_for(self, task: Task) -> TaskInputs:
        def res(name: str) -> Resource | None:
            value = task.args.get(name)
            if not value:
                return None
            return resolve(value, self.config.public_dir, self.config.max_fetch_bytes, self.config.fetch_timeout,
                           self.config.proxy, self.url_policy)

        return TaskInputs(task=task.task, text=task.args.get("text"), image=res("image"), audio=res("audio"))

    def llm_text_task(self, state: RequestState, task: Task) -> str:
        prompt = (
            f"The request [ {state.request.user_input} ] contains this task in JSON: {json.dumps(task.to_dict())}. "
            f"Act as a {task.task} system with the arguments {JSON_AS_IS.encode(task.args)} and give "
            "only the result, as plain text without URLs."
        )
        return state.llm.chat([{"role": "user", "content": prompt}],
                              max_tokens=stage_cap(state.llm, "text_task"))


CANCELLED = "cancelled: the client left"


def _chosen(state: RequestState, tid: int) -> dict[str, str] | str:
    """The `choose model result` of a task the deadline cut off while it ran: the model chosen for it, else the
    last one it was running on (its `tried` list says the rest). Lock held."""
    choice = state.selections.get(tid)
    if choice is not None and choice.done() and choice.exception() is None:
        chosen = choice.result().choose()
        if chosen:
            return chosen
    return {"id": state.attempts[tid][-1].get("model", ""), "reason": "the model it was running on when it was cut off"}


def _keeper(state: RequestState, tid: int, before: list[dict[str, str]]) -> Callable[[list[dict[str, str]]], None]:
    """Keeps task `tid`'s attempts in the request's state as they happen (`before`: earlier candidates')."""

    def keep(so_far: list[dict[str, str]]) -> None:
        with state.lock:
            state.attempts[tid] = [*before, *so_far]

    return keep


def _message(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error)


class Round:
    """One execution round of a request: tasks are added while it runs; `finish` waits and seals the results."""

    def __init__(self, executor: Executor, state: RequestState):
        self.executor = executor
        self.state = state
        self.by_id: dict[int, Task] = {}
        self.choices: dict[int, Future | None] = {}  # each task's model choice, as it was when the task was added
        with state.lock:  # a new round (after a replan): its tasks may write, the last round's no longer
            state.round = self
            state.sealed = False  # pragma: no mutate: only its truth is read (None would do as well)
        self.scheduler = Scheduler(self._body, max_workers=executor.config.max_workers, on_event=self._relay,
                                   executor=executor.threads)
        state.scheduler = self.scheduler
        if state.cancelled.is_set():
            self.scheduler.cancel()
        self.scheduler.start()  # each task runs the moment it is added with its inputs ready

    def add(self, task: Task) -> None:
        self.by_id[task.id] = task
        self.choices[task.id] = self.state.selections.get(task.id)  # this task's own, whatever replaces it
        self.scheduler.add(task.id, task.dep, failed=task.error)  # the scheduler ignores -1 ("no dependency")

    def _body(self, tid: int) -> dict[str, Any]:
        state = self.state
        result = self.executor.run_task(state, self.by_id[tid], self.choices.get(tid))
        with state.lock:
            if not state.sealed and state.round is self:
                state.results[tid] = result
        if "error" in result["inference result"]:
            raise TaskFailed(_message(result["inference result"]["error"]), result)
        return result

    def _relay(self, name: str, payload: dict[str, Any]) -> None:
        state = self.state
        payload = dict(payload)
        if name == "task_skipped":
            name, payload["skipped"] = "task_failed", True
        task = self.by_id.get(payload.get("id"))
        if task is not None:
            payload["task"] = task.task
        if name == "task_started" and task is not None:
            # "started" after "model chosen": the task waits for its choice anyway (run_task), so say it then;
            # a choice the LLM is still thinking about goes to the ranking's pick (the task is ready)
            choice = self.choices.get(task.id)
            if choice is not None:
                ready_to_start(state, task, choice)
                wait([choice], timeout=max(0.0, state.deadline - time.monotonic()))
        if name in ("task_finished", "task_failed") and not payload.get("skipped"):
            with state.lock:
                seconds = state.model_seconds.get(payload.get("id"))
            if seconds is not None:
                payload["model_seconds"] = round(seconds, 4)
        result = payload.pop("result", None)
        if isinstance(result, dict):
            payload["result"] = result.get("inference result")
            payload["args"] = result["task"]["args"]  # a task's result is always its collect_result record
            choose = result.get("choose model result")
            if isinstance(choose, dict) and choose.get("provider"):  # the Inference Provider that served it
                payload.update(model=choose.get("id"), hosted_on=choose.get("hosted_on"), provider=choose["provider"])
            elif name == "task_failed":  # where it failed last: the last candidate tried (and its provider)
                error = (payload["result"] or {}).get("error")
                tried = error.get("tried") if isinstance(error, dict) else None
                if tried:
                    last = tried[-1]
                    payload.update(model=last.get("model"), hosted_on=last.get("hosted_on"))
                    if last.get("provider"):
                        payload["provider"] = last["provider"]
        state.emit(name, payload)

    def finish(self) -> dict[int, Outcome]:
        state = self.state
        self.scheduler.close_input()
        outcomes = self.scheduler.run(timeout=max(0.1, state.deadline - time.monotonic()))
        with state.lock:  # the outcome is the truth: a task that timed out has no result, even if it wrote one
            state.sealed = True
            for tid, outcome in outcomes.items():
                if outcome.state not in (DONE, FAILED) or tid not in state.results:
                    error: dict[str, Any] = {"message": outcome.error or outcome.state}
                    chosen: dict[str, str] | str = ""
                    if outcome.state == TIMEOUT and state.attempts.get(tid):  # tried before the deadline cut it off
                        error["tried"] = list(state.attempts[tid])
                        chosen = _chosen(state, tid)
                    state.results[tid] = collect_result(self.by_id[tid], chosen, {"error": error})
        state.outcomes = outcomes
        return outcomes
