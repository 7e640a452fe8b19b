"""A self-contained offline demo: scripted LLM + the real models server on tiny models + the orchestrator.

    python tools/demo.py                 # then open the URL it prints (http://127.0.0.1:8004/ by default)
    python tools/demo.py --port 9000 --keep
    python tools/demo.py --cli           # the terminal chat (awesome_chat.py --mode cli) on the same stack

The scripted LLM plans from the request's words and the files it names (tools/demo_planner.py: a handful of
keyword rules, one or more per task family), so "Caption /examples/chelsea.jpg and read it aloud" captions the
photo and speaks the caption. Outputs come from random-weight models (pictures are noise), but every byte
goes through the real loading, serving and scheduling code.
Ctrl-C or SIGTERM stops all three servers and removes the demo's temporary folder (unless --keep).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HOST = "127.0.0.1"


def lively_captioner(folder: Path) -> None:
    """The tiny captioner, made to say words: its tokenizer read from vocab.txt (the saved tokenizer.json of this
    transformers version keeps only the special tokens), and only real words left to pick, so "read the caption
    aloud" has a caption (random words, it is still noise) to read."""
    import torch
    from transformers import VisionEncoderDecoderModel

    from tests.tiny_models import WORDS

    (folder / "tokenizer.json").unlink(missing_ok=True)
    model = VisionEncoderDecoderModel.from_pretrained(folder)
    words = [i for i, w in enumerate(WORDS) if w.isalpha() and not (w[0] == "w" and w[1:].isdigit())]
    with torch.no_grad():
        torch.manual_seed(1)
        table = model.decoder.transformer.wte.weight
        table[[i for i in range(len(WORDS)) if i not in words]] = 0
        table[words] = torch.randn(len(words), table.shape[1]) * 2
    model.generation_config.no_repeat_ngram_size = 1
    model.generation_config.max_new_tokens = 8
    model.save_pretrained(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8004, help="port of the web app (default %(default)s)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (models, outputs, logs)")
    parser.add_argument("--cli", action="store_true", help="chat in this terminal instead of serving the web app")
    args = parser.parse_args(argv)

    from hugginggpt.checks import taken_port_line

    if not args.cli:  # before 20 s of building models: a taken port is one line, at once
        taken = taken_port_line(HOST, args.port, "tools/demo.py")
        if taken:
            print(taken, file=sys.stderr)
            return 2

    from hugginggpt.cli import quiet_libraries

    quiet_libraries()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # the scripted LLM's access log stays out of the terminal
    from tests.conftest import ROOT, make_public, start_server, stop_server, write_config
    from tests.fakes.llm_server import ScriptedLLM, ThreadedServer
    from tests.test_models_server import start_models_server
    from tests.tiny_models import build_all, tiny_stable_diffusion
    from tools.demo_planner import answer_reply, plan_reply, text_task_reply

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    folder = Path(tempfile.mkdtemp(prefix="hugginggpt-demo-"))
    llm_srv = models_proc = server = None
    status = 0
    try:
        print("building tiny models and starting the servers (about 20 s)...", flush=True)
        models_dir = folder / "models"
        build_all(models_dir)
        lively_captioner(models_dir / "nlpconnect/vit-gpt2-image-captioning")
        tiny_stable_diffusion(models_dir / "stable-diffusion-v1-5/stable-diffusion-v1-5")
        public = make_public(folder / "public")
        for example in (ROOT / "public" / "examples").iterdir():
            (public / "examples" / example.name).write_bytes(example.read_bytes())
        llm = ScriptedLLM()
        llm_srv = ThreadedServer(llm.app()).start()
        llm.on("parse_task", plan_reply)
        llm.on("response_results", answer_reply)
        llm.on("text_task", text_task_reply)
        models_proc, models_url = start_models_server(folder, models_dir, public, deployment="full")
        config = write_config(folder, llm_srv.url, models_url, public, local_deployment="full",
                              request_timeout=300)  # a first request on a busy or slow machine: not the tests' 30 s
        print(f"demo config: {config}  (python awesome_chat.py --config {config} --mode cli|text|server uses "
              "this demo's LLM and models server)", flush=True)
        if args.cli:
            status = run_cli(config)
        else:
            server = start_server(config, folder, port=args.port)
            print(f"demo ready: {server.url}/  (Ctrl-C stops it)", flush=True)
            stop.wait()
    except KeyboardInterrupt:
        pass
    except RuntimeError as exc:  # a server did not start (the port was taken meanwhile, most likely)
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else "a server did not start"
        print(last if last.startswith("error:") else f"error: {last}", file=sys.stderr)
        return 2
    finally:
        if server is not None:
            stop_server(server)
        if models_proc is not None:
            models_proc.terminate()
            models_proc.wait(10)
        if llm_srv is not None:
            llm_srv.stop()
        if args.keep:
            print(f"kept {folder}", flush=True)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    print("demo stopped", flush=True)
    return status


def run_cli(config: Path) -> int:
    """awesome_chat.py --mode cli on the demo's config, in this terminal; Ctrl-C belongs to it while it runs."""
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, str(root / "awesome_chat.py"), "--config", str(config), "--mode", "cli"])
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the chat cancels its request; the demo stays
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    try:
        return proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    sys.exit(main())
