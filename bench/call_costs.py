"""What one call on a request's path costs the orchestrator in CPU, piece by piece.

Each line is the CPU (`time.thread_time` of the calling thread: the servers answering run on other threads)
of one call, the median of 5 batches of 100 after a warm-up, with the scripted LLM and the fake models
server of the tests answering at once (waitress, keep-alive) and the curated catalog in a catalog store:

- a model call through the local models server client (`LocalModelsServer.infer`, token classification);
- an LLM call through `LLMClient.chat` (the OpenAI SDK), plain and streamed (a 3-task plan, 30-odd pieces);
- a catalog store search for one task with the query's vector known (as each task's selection does);
- one request's ranking query embedded (the int8 MiniLM graph on ONNX Runtime; a 32-token request).

    python bench/call_costs.py

Run it in two checkouts to compare them (it imports `hugginggpt` from the checkout it is in).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import DEFAULT_MODELS, make_public  # noqa: E402
from tests.fakes.llm_server import KeepAliveServer, ScriptedLLM  # noqa: E402
from tests.fakes.models_server import FakeModels  # noqa: E402

REQUEST = ("Request 17: draw a fox, then tell me what the picture shows, and find the people and places in this "
           "sentence: Anna lives in Berlin.")
PLAN = json.dumps([
    {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}},
    {"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}},
    {"task": "token-classification", "id": 2, "dep": [-1], "args": {"text": "Anna lives in Berlin"}},
])


def cpu_ms(call: Callable[[], object], batches: int = 5, per_batch: int = 100) -> float:
    for _ in range(10):
        call()
    times = []
    for _ in range(batches):
        start = time.thread_time()
        for _ in range(per_batch):
            call()
        times.append((time.thread_time() - start) * 1000 / per_batch)
    return statistics.median(times)


def main() -> None:
    from bench.shipped_ranking import shipped_ranking
    from hugginggpt.backends import TaskInputs
    from hugginggpt.backends.local import LocalModelsServer
    from hugginggpt.catalog import RankQuery
    from hugginggpt.config import LLMSettings
    from hugginggpt.llm import LLMClient

    folder = Path(tempfile.mkdtemp(prefix="call-costs-"))
    public = make_public(folder / "public")
    llm = ScriptedLLM(keep_streams_alive=True)  # as OpenAI and vLLM keep a stream's connection
    llm.on("parse_task", PLAN)
    llm.on("response_results", "done")
    llm_srv = KeepAliveServer(llm.app()).start()
    models_srv = KeepAliveServer(FakeModels(public=public, models=dict(DEFAULT_MODELS)).app()).start()
    try:
        shipped = shipped_ranking(folder)
        ranker, store = shipped.ranker, shipped.store
        vector = ranker.query_vectors([RankQuery(task="token-classification", text=REQUEST)])[0]
        client = LLMClient(LLMSettings(api_type="local", endpoint=llm_srv.url + "/v1", model="scripted"))
        models = LocalModelsServer(models_srv.url, public)
        plan_messages = [{"role": "user", "content": "#1 Task Planning Stage. " + REQUEST}]
        answer_messages = [{"role": "user", "content": "#4 Response Generation Stage. " + REQUEST}]
        n = 0

        def embed() -> object:  # a new text each time: the query cache must not answer
            nonlocal n
            n += 1
            return ranker.query_vectors([RankQuery(task="token-classification", text=f"{REQUEST} ({n})")])

        rows = [
            ("model call (LocalModelsServer.infer, token classification)",
             lambda: models.infer("dslim/bert-base-NER", TaskInputs("token-classification", text="Anna lives in Berlin"))),
            ("LLM call, plain (LLMClient.chat)", lambda: client.chat(answer_messages)),
            ("LLM call, streamed 3-task plan (LLMClient.chat, on_token)",
             lambda: client.chat(plan_messages, on_token=lambda piece: None)),
        ]
        rows += [(f"catalog store search, {task}", lambda task=task: store.search(task, REQUEST, limit=10,
                                                                                 query_vector=vector))
                 for task in ("text-to-image", "image-to-text", "token-classification")]
        rows.append(("ranking query embedded (one request, cache miss)", embed))
        print(f"CPU per call, median of 5 x 100 ({ROOT.name})")
        print("| call | ms |")
        print("|---|---|")
        for label, call in rows:
            print(f"| {label} | {cpu_ms(call):.3f} |")
    finally:
        llm_srv.stop()
        models_srv.stop()


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
