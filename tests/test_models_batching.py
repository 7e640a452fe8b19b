"""Dynamic batching through the real models server over HTTP: concurrent requests of one model share a batch,
each caller gets its own answer or its own error, and `max_batch_size: 1` turns it off."""

from __future__ import annotations

import math
import threading

import pytest
import requests

from tests.conftest import make_public
from tests.test_models_server import start_models_server
from tests.tiny_models import bert_config, close, token_classifier, words_tokenizer

TEXT = "distilbert/distilbert-base-uncased-finetuned-sst-2-english"
NER = "dslim/bert-base-NER"
TEXTS = ["a great movie", "anna lives in berlin", "the cat sits on the mat", "bad", "the red fox is on the table",
         "who lives in paris ?", "hello world", "w1 w2 w3 w4 w5 w6 w7"]


def text_classifier(folder) -> None:
    """tiny_models' classifier with weights spread wider, so that every text gets a score of its own."""
    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    BertForSequenceClassification(bert_config(num_labels=2, id2label={0: "NEGATIVE", 1: "POSITIVE"},
                                              label2id={"NEGATIVE": 0, "POSITIVE": 1},
                                              initializer_range=0.5)).save_pretrained(folder)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """The same models behind two servers: batching on (a long wait, so a burst always gathers) and off."""
    folder = tmp_path_factory.mktemp("batching")
    models = folder / "models"
    for mid, build in ((TEXT, text_classifier), (NER, token_classifier)):
        build(models / mid)
        words_tokenizer(models / mid)
    public = make_public(folder / "public")
    procs = []
    try:
        for extra in (("max_batch_size: 8", "batch_wait_ms: 1000"), ("max_batch_size: 1",)):
            procs.append(start_models_server(folder, models, public, extra=extra))
        yield procs[0][1], procs[1][1]
    finally:
        for proc, _ in procs:
            proc.terminate()
            proc.wait(10)


def post(url: str, model: str, body: dict) -> requests.Response:
    return requests.post(f"{url}/models/{model}", json=body, timeout=120)


def burst(url: str, model: str, bodies: list[dict]) -> list[requests.Response]:
    """All bodies at once, each from its own thread (released together)."""
    out: list = [None] * len(bodies)
    gate = threading.Barrier(len(bodies))

    def call(k: int) -> None:
        gate.wait()
        out[k] = post(url, model, bodies[k])

    threads = [threading.Thread(target=call, args=(k,)) for k in range(len(bodies))]
    [t.start() for t in threads]
    [t.join(180) for t in threads]
    assert all(r is not None for r in out)
    return out


def test_eight_concurrent_requests_share_a_batch_and_get_eight_separate_answers(servers):
    on, off = servers
    alone = [post(off, TEXT, {"text": t}) for t in TEXTS]  # one at a time, no batching: the reference answers
    assert [r.status_code for r in alone] == [200] * 8
    together = burst(on, TEXT, [{"text": t} for t in TEXTS])
    assert [r.status_code for r in together] == [200] * 8, [r.text for r in together]
    for k, (a, b) in enumerate(zip(alone, together, strict=True)):
        assert close(b.json(), a.json(), 1e-6), (TEXTS[k], b.json(), a.json())
    scores = [r.json()[0]["score"] for r in alone]  # answers differ, so a swapped answer could not pass as close
    assert all(not math.isclose(x, y, abs_tol=1e-6) for k, x in enumerate(scores) for y in scores[k + 1:])
    sizes = sorted(int(r.headers["X-Batch-Size"]) for r in together)
    assert sizes[-1] > 1, sizes  # the first loaded the model; the others gathered meanwhile
    assert all(sizes.count(n) % n == 0 for n in set(sizes)), sizes  # n requests said "n" for each batch of n


def test_one_bad_input_among_them_fails_only_its_caller(servers):
    """A text too long for the model makes the batch raise: it runs again one by one, and only that caller gets
    the error; a body without text is refused before it joins a batch."""
    on, off = servers
    bodies = [{"text": t} for t in TEXTS[:6]] + [{"text": " ".join(["cat"] * 300)}, {"txt": "typo"}]
    alone = [post(off, NER, body) for body in bodies]
    together = burst(on, NER, bodies)
    assert [r.status_code for r in alone] == [200] * 6 + [500, 400], [r.text for r in alone]
    assert [r.status_code for r in together] == [200] * 6 + [500, 400], [r.text for r in together]
    for a, b in zip(alone[:6], together[:6], strict=True):
        assert close(b.json(), a.json(), 1e-6)
    assert NER in together[6].json()["error"]["message"]
    assert "`text` is required" in together[7].json()["error"]["message"]
    assert max(int(r.headers["X-Batch-Size"]) for r in together[:6]) > 1


def test_max_batch_size_1_turns_batching_off(servers):
    _, off = servers
    together = burst(off, TEXT, [{"text": t} for t in TEXTS])
    assert [r.status_code for r in together] == [200] * 8
    assert [r.headers["X-Batch-Size"] for r in together] == ["1"] * 8


def test_the_batching_keys_are_checked(tmp_path):
    from hugginggpt.config import load_config
    from hugginggpt.errors import ConfigError

    path = tmp_path / "c.yaml"
    path.write_text("openai: {api_key: unused}\n")
    config = load_config(path, need_llm=False, env={})
    assert (config.batch_wait_ms, config.max_batch_size) == (5.0, 32) and not config.warnings
    for line, words in (("batch_wait_ms: -1", "`batch_wait_ms` must be a number of milliseconds"),
                        ("batch_wait_ms: 'soon'", "`batch_wait_ms` must be a number of milliseconds"),
                        ("max_batch_size: 0", "`max_batch_size` must be a positive whole number"),
                        ("max_batch_size: 2.5", "`max_batch_size` must be a int")):
        path.write_text(f"openai: {{api_key: unused}}\n{line}\n")
        with pytest.raises(ConfigError, match=words):
            load_config(path, need_llm=False, env={})
