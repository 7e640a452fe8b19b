"""Where one models-server call is, for a client that asked to watch it (issue 48).

A call passes through phases: `queued` (behind a batch, or waiting for the model another request is using,
or for another model's load), `downloading` (a Hub model's first use: bytes done of the total), `loading`, and
`running` (with `step k of n` where the work has steps: a diffusion pipeline's denoising steps, a generator's
new tokens). A `Watch` turns what the pool, the batcher, the discovery and the handlers report into plain
events for its `send`; it lives in a context variable (`watching`), so a call that nobody watches reports to
nothing and pays a lookup. The app (`app.py`) sends the events as SSE and the orchestrator relays them.

Events carry no path, URL or token: a phase, numbers, and a sentence of what the call waits for.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..cancel import Cancelled

QUEUED, DOWNLOADING, LOADING, RUNNING = "queued", "downloading", "loading", "running"
PHASES = (QUEUED, DOWNLOADING, LOADING, RUNNING)

Send = Callable[[dict[str, Any]], None]


class Watch:
    """One call's progress. `send` gets each event (a dict); `stop()` makes the next step of the work raise
    `Cancelled` (its client left), so a long diffusion run ends at its next step, not its last.

    Steps are sent each (a client counts them); downloads at most every `byte_gap` seconds, besides their first
    and last reading. An ETA (seconds) comes from the pace of the steps so far, measured from the first step's
    end: a pipeline's set-up before its first step is no step's time.
    """

    def __init__(self, send: Send, *, clock: Callable[[], float] = time.monotonic, byte_gap: float = 0.25):
        self._send = send
        self._clock = clock
        self.byte_gap = byte_gap
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._last_phase: tuple[Any, ...] | None = None  # pragma: no mutate: no phase key is falsy
        self._first_step: tuple[int, float] | None = None  # (step, when it ended)
        self._bytes_sent_at: float | None = None

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def stop(self) -> None:
        self._stopped.set()

    def _emit(self, event: dict[str, Any]) -> None:
        with self._lock:  # events of one call leave in the order they were made, one at a time
            self._send(event)

    def phase(self, phase: str, waiting: str | None = None) -> None:
        """A new phase (the same phase and reason twice in a row is sent once); the steps' pace starts again."""
        key = (phase, waiting)
        self._first_step = None
        if key == self._last_phase:
            return
        self._last_phase = key
        self._emit({"phase": phase, **({"waiting": waiting} if waiting else {})})

    def step(self, done: int, total: int) -> None:
        """`done` of `total` steps have ended (1-based). Raises Cancelled once the client has left."""
        if self.stopped:
            raise Cancelled("the client left while the model ran")
        now = self._clock()
        self._last_phase = (RUNNING, None)
        event: dict[str, Any] = {"phase": RUNNING, "step": done, "steps": total,
                                 "fraction": round(min(done / total, 1.0), 4) if total > 0 else None}
        if self._first_step is None:
            self._first_step = (done, now)
        else:
            first, at = self._first_step
            if done > first:
                event["eta"] = round(max(total - done, 0) * (now - at) / (done - first), 2)
        self._emit(event)

    def downloaded(self, done: int, total: int | None) -> None:
        """Bytes of a download so far; `total` may grow as the download finds more files. A download goes on when
        its client leaves: other requests may wait for the same model, and the next use needs it anyway."""
        if self.stopped:
            return
        now = self._clock()
        last = total is not None and done >= total
        if self._bytes_sent_at is not None and not last and now - self._bytes_sent_at < self.byte_gap:
            return
        self._bytes_sent_at = now
        self._last_phase = (DOWNLOADING, None)
        self._emit({"phase": DOWNLOADING, "bytes": int(done), "total_bytes": int(total) if total else None,
                    "fraction": round(min(done / total, 1.0), 4) if total else None})


    def relay(self, event: dict[str, Any]) -> None:
        """An event another process's watch made (a Ray replica's), passed on as it is. Raises Cancelled once the
        client has left, which ends the relaying call (and with it the replica's work)."""
        if self.stopped:
            raise Cancelled("the client left while the model ran")
        self._last_phase = (event.get("phase"), event.get("waiting"))
        self._emit(event)


CURRENT: contextvars.ContextVar[Watch | None] = contextvars.ContextVar("modelhost_progress", default=None)


def current() -> Watch | None:
    return CURRENT.get()


def _watching(watch: Watch | None) -> Iterator[Watch | None]:
    token = CURRENT.set(watch)
    try:
        yield watch
    finally:
        CURRENT.reset(token)


watching = contextlib.contextmanager(_watching)  # wrapped, not decorated: mutmut skips decorated functions


def phase(name: str, waiting: str | None = None) -> None:
    """Report a phase to the call's watch, if it has one."""
    watch = CURRENT.get()
    if watch is not None:
        watch.phase(name, waiting)


WAIT_CHECK_SECONDS = 0.1  # how often a queued call asks whether its client is still there


def _waiting_for(lock: Any, why: str, leave: bool = True) -> Iterator[None]:
    """Hold `lock`; a watched call that must wait for it says so (`queued`, with `why`) first, and leaves the queue
    (Cancelled) once its client has gone: nobody waits for it, and the callers behind it should not either. With
    `leave` False it waits on (a batch's leader: the others in its batch still want it run)."""
    if not lock.acquire(blocking=False):
        phase(QUEUED, why)
        watch = CURRENT.get() if leave else None
        while not lock.acquire(timeout=WAIT_CHECK_SECONDS):
            if watch is not None and watch.stopped:
                raise Cancelled("the client left while the call waited")
    try:
        yield
    finally:
        lock.release()


waiting_for = contextlib.contextmanager(_waiting_for)


def diffusion_steps(pipe: Any, steps: int) -> dict[str, Any]:
    """Keyword arguments that make a diffusers pipeline report each denoising step to the call's watch; none when
    nobody watches (a call nobody watches runs as before). Pipelines take `callback_on_step_end`; older ones
    (text-to-video) `callback` and `callback_steps`."""
    watch = CURRENT.get()
    if watch is None:
        return {}
    watch.phase(RUNNING)
    import inspect

    params = inspect.signature(pipe.__call__).parameters
    if "callback_on_step_end" in params:
        def on_step_end(running: Any, index: int, _timestep: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
            # the steps it really runs: an image-to-image `strength` below 1 runs fewer than it was asked
            watch.step(index + 1, getattr(running, "_num_timesteps", None) or steps)
            return kwargs
        return {"callback_on_step_end": on_step_end}
    if "callback" in params:
        def on_step(index: int, _timestep: Any, _latents: Any) -> None:
            watch.step(index + 1, steps)
        return {"callback": on_step, "callback_steps": 1}
    return {}


def token_steps(limit: int) -> dict[str, Any]:
    """A `streamer` for `generate` that reports each new token as a step of `limit` (the most it may make: the
    ETA is an upper bound, and a generator that stops early ends with its last step below `limit`)."""
    watch = CURRENT.get()
    if watch is None:
        return {}
    watch.phase(RUNNING)
    from transformers.generation.streamers import BaseStreamer

    class Steps(BaseStreamer):
        def __init__(self) -> None:
            self.seen_prompt = False  # pragma: no mutate: None is as false
            self.made = 0

        def put(self, value: Any) -> None:
            if not self.seen_prompt:  # generate hands the prompt first
                self.seen_prompt = True
                return
            # generate hands one token as 1-D (a batch of one: shape[-1] is 1), several at once as 2-D (assisted
            # decoding): index and test differ from their mutants only on shapes generate never hands a streamer
            self.made += int(value.shape[-1]) if value.dim() > 1 else 1  # pragma: no mutate
            watch.step(min(self.made, limit), limit)

        def end(self) -> None:
            pass

    return {"streamer": Steps()}
