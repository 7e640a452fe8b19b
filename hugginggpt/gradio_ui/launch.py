"""`python run_gradio_demo.py`: the Gradio app on the engine in this process, on a running orchestrator
(`--server URL`), or, when no LLM is configured, on the offline demo stack (as `make run` does).

    python run_gradio_demo.py [--config configs/config.gradio.yaml] [--port 7860] [--host 127.0.0.1]
    python run_gradio_demo.py --server http://gpu-box:8004 [--token T]
    python run_gradio_demo.py --visitor-keys        # no LLM configured: each visitor enters their own key

The URL is printed only once the app answers on it. Ctrl-C or SIGTERM stops the app and what it started.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = "configs/config.gradio.yaml"
DEMO_READY = re.compile(r"^demo ready: (https?://\S+?)/?\s")


class StartError(Exception):
    """The app cannot start; the message is the one line the user sees."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="YAML config (default: %(default)s)")
    parser.add_argument("--port", type=int, default=None, help="port (default: $GRADIO_SERVER_PORT or 7860)")
    parser.add_argument("--host", default=None, help="address (default: $GRADIO_SERVER_NAME or 127.0.0.1)")
    parser.add_argument("--server", help="drive a running orchestrator at this URL instead of one in this process")
    parser.add_argument("--token", default=os.environ.get("HUGGINGGPT_API_TOKEN"),
                        help="bearer token of that orchestrator (default: $HUGGINGGPT_API_TOKEN)")
    parser.add_argument("--visitor-keys", action="store_true",
                        help="with no LLM configured, ask each visitor for their own key instead of the offline demo")
    parser.add_argument("--verbose", action="store_true", help="log each request (never its keys) to stderr")
    return parser.parse_args(argv)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DemoStack:
    """tools/demo.py as a child process: scripted LLM, the real models server on tiny models, the orchestrator."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tools" / "demo.py"), "--port", str(free_port())],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                                     start_new_session=True)

    def wait(self, timeout: float = 600.0) -> str:
        """The orchestrator's URL once the stack says it is ready."""
        deadline, seen = time.monotonic() + timeout, []
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            match = DEMO_READY.match(line)
            if match:
                # keep its pipe drained (a full one would stall its servers), never holding up the exit
                threading.Thread(target=self.proc.stdout.read, name="demo-stack-log", daemon=True).start()
                return match.group(1)
            seen.append(line.rstrip())
            print(f"  {line.rstrip()}", file=sys.stderr, flush=True)
        self.stop()
        raise StartError("the offline demo stack did not start: " + (seen[-1] if seen else "no output"))

    def stop(self, grace: float = 60.0) -> None:
        """SIGTERM, for the stack to stop its servers in order; past `grace`, or once it has ended, SIGKILL to
        whatever is left of its session (its own process group): no models server it started outlives it,
        holding the port or the GPU, even when the stack itself failed to stop it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace)
        with contextlib.suppress(ProcessLookupError):  # nothing left of it
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def orchestrator_for(args: argparse.Namespace, stack: contextlib.ExitStack) -> tuple[Any, dict[str, Any]]:
    """(orchestrator, app options) for the arguments; raises StartError with one line."""
    from ..config import load_config
    from ..errors import ConfigError, NoLLMConfigured
    from ..logs import setup_logging
    from .orchestrators import InProcess, Remote

    options: dict[str, Any] = {"allowed_paths": [str(ROOT / "public" / "examples")]}
    if args.server:
        remote = Remote(args.server, args.token)
        stack.callback(_remove, remote.files)
        _check(remote)
        return remote, options
    try:
        try:
            config = load_config(args.config)
        except NoLLMConfigured:
            if not args.visitor_keys:
                raise
            config = load_config(args.config, need_llm=False)
    except NoLLMConfigured as exc:
        config = None
        reason = str(exc)
    except ConfigError as exc:
        raise StartError(f"config error: {exc}") from None
    else:
        reason = "the config names no LLM backend and OPENAI_API_KEY is not set"
    no_llm = config is None or (config.llm.api_type is None and not config.llm.api_key)
    if no_llm and not args.visitor_keys:
        print(f"no LLM configured ({reason}); starting the offline demo stack (scripted LLM, tiny models). "
              "Export OPENAI_API_KEY or edit the config for real answers.", file=sys.stderr, flush=True)
        demo = DemoStack()
        stack.callback(demo.stop)  # before waiting: a Ctrl-C while it starts stops it too
        remote = Remote(demo.wait())
        stack.callback(_remove, remote.files)
        _check(remote)  # ready, it said: a stack that does not answer is a start error too, in one line
        options["note"] = ("**Offline demo**: a scripted LLM always plans the same four tasks, run by tiny "
                           "random-weight models (the pictures are noise). Add an LLM for real answers.")
        return remote, options
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    setup_logging(config.debug, config.log_file, quiet=not args.verbose)
    from ..chat import HuggingGPT

    engine = HuggingGPT(config)
    if engine.ranking == "warming":
        print("loading the model ranker (all-MiniLM-L6-v2)...", file=sys.stderr, flush=True)
    engine.warm()
    # public/ is not served as such: a run's outputs are copied into Gradio's folder for their visitor only
    options["max_upload_bytes"] = config.max_body_bytes
    options["slots"] = config.max_concurrent_requests  # the engine's admission: past that, refused at once
    return InProcess(engine, config), options


def _check(remote: Any) -> None:
    from .orchestrators import UserError

    try:
        remote.check()
    except UserError as exc:
        raise StartError(str(exc)) from None


def _remove(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


def page_answers(url: str, seconds: float) -> bool:
    """Whether GET `url` answers 200 within `seconds` (a try under way when they end runs to its own 2 s
    connect and 2 s read timeouts)."""
    import requests

    deadline = time.monotonic() + seconds
    while True:
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return True
        except requests.RequestException:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def serve(args: argparse.Namespace, started: float) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # Importing Gradio takes seconds: do it while the engine loads (or the demo stack starts).
    importing = threading.Thread(target=importlib.import_module, args=("gradio",), name="import-gradio", daemon=True)
    importing.start()
    with contextlib.ExitStack() as stack:
        orchestrator, options = orchestrator_for(args, stack)
        importing.join()
        import gradio as gr

        from .app import CSS, build_app
        from .sessions import VisitorFiles, launch_options

        allowed = options.pop("allowed_paths")
        slots = options.pop("slots", 64)
        files = VisitorFiles()
        demo = build_app(orchestrator, files=files, **options)  # chat runs unbounded by Gradio: admission decides
        demo.queue(default_concurrency_limit=16)
        try:
            # a thread per running chat (each waits on its events) and some to spare, so a refusal is never queued
            demo.launch(server_name=args.host, server_port=args.port, prevent_thread_lock=True, quiet=True,
                        allowed_paths=allowed, theme=gr.themes.Soft(), css=CSS, show_error=False,
                        max_file_size=options.get("max_upload_bytes", 10 * 1024 * 1024),
                        max_threads=max(40, slots + 16), **launch_options(files))
        except OSError as exc:
            raise StartError(f"cannot serve on port {args.port or 7860}: {str(exc).splitlines()[0]}") from None
        stack.callback(demo.close)
        url = demo.local_url.rstrip("/")
        if not page_answers(url + "/", seconds=10):  # launch returned: "ready" only once the page itself answers
            raise StartError(f"the app does not answer at {url}/")
        print(f"HuggingGPT Gradio app ready: {url}/  (started in {time.perf_counter() - started:.1f} s; "
              "Ctrl-C stops it)", flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    print("app stopped", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home from a visitor's request
    if not args.verbose:
        from ..cli import quiet_libraries

        quiet_libraries()
    try:
        return serve(args, started)
    except StartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
