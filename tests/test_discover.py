"""Hub models outside the catalog (issue 17, item 4): judged from the Hub's info, downloaded once, refused clearly.

The Hub is tests/fakes/hub_repo.py on loopback, read by the real huggingface_hub client; the model is a tiny
random token classifier (tests/tiny_models.py) under ids that are not in data/p0_models.jsonl.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from hugginggpt.config import load_config
from hugginggpt.errors import ConfigError
from hugginggpt.modelhost.discover import (
    MARKER,
    Discovery,
    DiscoveryPolicy,
    DiscoveryRefused,
    id_problem,
    select_files,
)
from tests.fakes.hub_repo import FakeHubServer
from tests.tiny_models import token_classifier

NER = "tiny-org/tiny-ner"


def tiny_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def with_auto_map(files: dict[str, bytes]) -> dict[str, bytes]:
    config = json.loads(files["config.json"])
    config["auto_map"] = {"AutoModelForTokenClassification": "modeling_evil.EvilModel"}
    return {**files, "config.json": json.dumps(config).encode(), "modeling_evil.py": b"import os\nos.system('x')\n"}


def add_repos(hub, files: dict[str, bytes]) -> None:
    """The repositories every test here may ask for."""
    tc = "token-classification"
    for rid in (NER, "tiny-org/tiny-ner-race", "tiny-org/status-only", "evil-org/tiny-ner", "Tiny-Org/case-ner"):
        hub.add(rid, files, pipeline_tag=tc)
    hub.add("tiny-org/remote-code", with_auto_map(files), pipeline_tag=tc, tags=("custom_code",))
    # the Hub's summary says nothing, the config.json does: caught after the configs, before the weights
    hub.add("tiny-org/sneaky-code", with_auto_map(files), pipeline_tag=tc, config={"model_type": "bert"})
    hub.add("tiny-org/gated-ner", files, pipeline_tag=tc, gated="manual")
    hub.add("tiny-org/rl-agent", {"model.zip": b"zip", "config.json": b"{}"}, pipeline_tag="reinforcement-learning",
            library_name="stable-baselines3")
    hub.add("tiny-org/onnx-only", {"config.json": files["config.json"], "onnx/model.onnx": b"onnx"}, pipeline_tag=tc)


@pytest.fixture(scope="module")
def tiny_ner_files(tmp_path_factory) -> dict[str, bytes]:
    folder = tmp_path_factory.mktemp("tiny-ner-src")
    token_classifier(folder)
    return tiny_files(folder)


@pytest.fixture(scope="module")
def hub(tiny_ner_files):
    with FakeHubServer() as server:
        add_repos(server.repos, tiny_ner_files)
        yield server


def discovery(hub, models_dir: Path, **policy) -> Discovery:
    return Discovery(DiscoveryPolicy(mode=policy.pop("mode", "local"), **policy), models_dir, endpoint=hub.url,
                     token=None)


# -- ids, authors, files: plain data ------------------------------------------------------------------------


@pytest.mark.parametrize("model_id", ["tiny-org/tiny-ner", "a/b", "Org_1/model.v2-x", "o/" + "n" * 96])
def test_hub_ids_that_are_valid(model_id):
    assert id_problem(model_id) is None


@pytest.mark.parametrize("model_id", [
    "tiny-ner", "a/b/c", "/etc/passwd", "../x", "a/..", "../../etc", "a/.hidden", "a/b..c", "a/b--c",
    "a/" + "n" * 97, "a/b c", "a\\b", "a/b\x00", "\u00e4/b", "a/-b", "a/b.", "", "a/", "/a", "a//b", 42, None])
def test_hub_ids_that_are_refused(model_id, tmp_path):
    assert id_problem(model_id)
    if isinstance(model_id, str):
        with pytest.raises(DiscoveryRefused) as exc:
            Discovery(DiscoveryPolicy(mode="local"), tmp_path).folder(model_id)
        assert exc.value.status == 400 and exc.value.kind == "bad_model_id"


def test_author_lists_deny_wins_and_compare_without_case():
    policy = DiscoveryPolicy(mode="local", allow=("tiny-org", "evil-org"), deny=("Evil-Org",))
    assert policy.author_problem("tiny-org/x") is None
    assert policy.author_problem("TINY-ORG/x") is None
    assert "discovered_authors_deny" in policy.author_problem("evil-org/x")
    assert "discovered_authors_allow" in policy.author_problem("other/x")
    assert DiscoveryPolicy(mode="local", deny=("bad",)).author_problem("anyone/x") is None


def test_only_the_files_a_pipeline_reads_are_fetched():
    repo = ["config.json", "model.safetensors", "pytorch_model.bin", "tf_model.h5", "flax_model.msgpack",
            "onnx/model.onnx", "onnx/config.json", "modeling_evil.py", "README.md", ".gitattributes",
            "training_args.bin", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "spiece.model",
            "checkpoints/epoch-1/model.safetensors", "model.fp16.safetensors"]
    assert select_files(repo, "transformers") == ["config.json", "model.safetensors", "spiece.model",
                                                  "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    assert select_files(["config.json", "pytorch_model.bin", "training_args.bin"], "transformers") == [
        "config.json", "pytorch_model.bin"]  # .bin only where no safetensors exist, never training_args
    sd = ["model_index.json", "v1-5-pruned.safetensors", "unet/config.json", "unet/diffusion_pytorch_model.safetensors",
          "unet/diffusion_pytorch_model.fp16.safetensors", "text_encoder/model.safetensors",
          "text_encoder/pytorch_model.bin", "scheduler/scheduler_config.json", "tokenizer/vocab.json",
          "safety_checker/model.safetensors", "vae/diffusion_pytorch_model.non_ema.bin", "vae/config.json",
          "vae/diffusion_pytorch_model.bin", "unet/sub/extra.safetensors"]
    assert select_files(sd, "diffusers") == [
        "model_index.json", "safety_checker/model.safetensors", "scheduler/scheduler_config.json",
        "text_encoder/model.safetensors", "tokenizer/vocab.json", "unet/config.json",
        "unet/diffusion_pytorch_model.safetensors", "vae/config.json", "vae/diffusion_pytorch_model.bin"]
    st = ["modules.json", "config.json", "model.safetensors", "1_Pooling/config.json", "2_Dense/model.safetensors",
          "eval/results.json"]
    assert select_files(st, "sentence-transformers") == ["1_Pooling/config.json", "2_Dense/model.safetensors",
                                                         "config.json", "model.safetensors", "modules.json"]


def test_config_keys_defaults_and_errors(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("openai: {api_key: x}\n")
    c = load_config(cfg, need_llm=False, strict=True)
    assert (c.discovered_models, c.discovered_authors_allow, c.discovered_authors_deny) == ("hosted", (), ())
    cfg.write_text("discovered_models: local\ndiscovered_authors_allow: [google, tiny-org]\n"
                   "discovered_authors_deny: evil-org\n")
    c = load_config(cfg, need_llm=False, strict=True)
    assert c.discovered_models == "local" and c.discovered_authors_allow == ("google", "tiny-org")
    assert c.discovered_authors_deny == ("evil-org",)
    cfg.write_text("discovered_models: everywhere\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: `discovered_models` must be one of hosted, local, off"):
        load_config(cfg, need_llm=False)
    cfg.write_text("discovered_authors_deny: [../etc]\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: `discovered_authors_deny` holds '\.\./etc'"):
        load_config(cfg, need_llm=False)


# -- against the fake Hub, in this process --------------------------------------------------------------------


def test_status_judges_from_the_hub_without_downloading(hub, tmp_path):
    d = discovery(hub, tmp_path)
    assert d.status("tiny-org/status-only") == {"loaded": False, "loadable": True, "discovered": True,
                                                "task": "token-classification", "size_mb": 0.1}
    assert not [r for r in hub.repos.requests_for("tiny-org/status-only") if "/resolve/" in r[1] or "/cdn/" in r[1]]
    assert not (tmp_path / "tiny-org").exists()
    refused = d.status("tiny-org/rl-agent")
    assert refused["loadable"] is False and refused["kind"] == "no_generic_loader"
    assert "stable-baselines3" in refused["problem"]


@pytest.mark.parametrize("model_id, status, kind", [
    ("evil-org/tiny-ner", 403, "author_denied"),
    ("tiny-org/remote-code", 422, "remote_code"),
    ("tiny-org/gated-ner", 403, "gated"),
    ("tiny-org/rl-agent", 422, "no_generic_loader"),
    ("tiny-org/onnx-only", 422, "no_weights"),
    ("tiny-org/nothing-here", 404, "not_on_hub"),
    ("tiny-org/..", 400, "bad_model_id"),
])
def test_refusals_name_the_reason_and_fetch_nothing(hub, tmp_path, model_id, status, kind):
    d = discovery(hub, tmp_path, deny=("evil-org",))
    with pytest.raises(DiscoveryRefused) as exc:
        d.ensure(model_id)
    assert (exc.value.status, exc.value.kind) == (status, kind), str(exc.value)
    assert not [r for r in hub.repos.requests_for(model_id) if "/resolve/" in r[1] or "/cdn/" in r[1]]
    if kind == "author_denied":  # decided from the id alone: the Hub is never asked
        assert hub.repos.requests_for(model_id) == []


def test_auto_map_in_a_downloaded_config_stops_before_the_weights(hub, tmp_path):
    d = discovery(hub, tmp_path)
    assert d.status("tiny-org/sneaky-code")["loadable"] is True  # the Hub's summary does not show it
    with pytest.raises(DiscoveryRefused) as exc:
        d.ensure("tiny-org/sneaky-code")
    assert (exc.value.status, exc.value.kind) == (422, "remote_code") and "auto_map" in str(exc.value)
    assert hub.repos.downloads_of("tiny-org/sneaky-code", "model.safetensors") == 0
    assert not (tmp_path / "tiny-org/sneaky-code/modeling_evil.py").exists()
    assert not (tmp_path / "tiny-org/sneaky-code" / MARKER).exists()
    assert d.status("tiny-org/sneaky-code")["kind"] == "remote_code"  # remembered


def test_size_cap(hub, tmp_path):
    with pytest.raises(DiscoveryRefused) as exc:
        discovery(hub, tmp_path, max_size_mb=0.01).ensure(NER)
    assert (exc.value.status, exc.value.kind) == (422, "too_large") and "max_model_size_mb" in str(exc.value)
    assert discovery(hub, tmp_path, max_size_mb=1).status(NER)["loadable"] is True


def test_concurrent_first_requests_download_once(hub, tmp_path, monkeypatch, caplog):
    import huggingface_hub

    from hugginggpt.modelhost import discover

    monkeypatch.setattr(discover._LoggedProgress, "every", 0.0)  # log every progress step of the weights
    caplog.set_level("INFO", logger="hugginggpt.modelhost.discover")

    calls = []

    def counting(**kwargs):
        calls.append(kwargs["allow_patterns"])
        return huggingface_hub.snapshot_download(**kwargs)

    rid = "tiny-org/tiny-ner-race"
    d = Discovery(DiscoveryPolicy(mode="local"), tmp_path, endpoint=hub.url, downloader=counting)
    hub.repos.delays["model.safetensors"] = 0.4
    start, specs, errors = threading.Barrier(4), [], []

    def first_request():
        start.wait()
        try:
            specs.append(d.ensure(rid))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    try:
        threads = [threading.Thread(target=first_request) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        hub.repos.delays.clear()
    assert not errors and len(specs) == 4 and len({s for s in specs}) == 1
    assert d.downloads == 1 and len(calls) == 2  # configs, then weights: once
    assert hub.repos.downloads_of(rid, "model.safetensors") == 1
    spec = specs[0]
    assert (spec.task, spec.loader, spec.pipeline_task, spec.source) == ("token-classification", "pipeline",
                                                                          "token-classification", "hub")
    assert "model.safetensors" in spec.files and not any(f.endswith(".py") for f in spec.files)
    before = len(hub.repos.requests)
    assert d.ensure(rid) == spec and len(hub.repos.requests) == before  # on disk: the Hub is not asked again
    assert [s.id for s in d.listed()] == [rid]
    logged = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"{rid}: not curated; downloading 5 files (0.1 MB of weights)") for m in logged)
    assert any(m.startswith(f"{rid}: 0.1 of 0.1 MB downloaded") for m in logged)
    assert sum(m.startswith(f"{rid}: downloaded in") for m in logged) == 1


def test_diffusers_text_to_image_is_judged_by_its_components(hub, tmp_path):
    from hugginggpt.modelhost.discover import diffusers_components_problem

    index = {"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
             "text_encoder": ["transformers", "CLIPTextModel"], "feature_extractor": [None, None],
             "safety_checker": ["stable_diffusion", "StableDiffusionSafetyChecker"]}
    files = {"model_index.json": json.dumps(index).encode(), "unet/config.json": b"{}",
             "unet/diffusion_pytorch_model.safetensors": b"w" * 100, "sd-v1-5-pruned.safetensors": b"w" * 1000}
    hub.repos.add("tiny-org/tiny-sd", files, pipeline_tag="text-to-image", library_name="diffusers", config={})
    found = discovery(hub, tmp_path).hub_model("tiny-org/tiny-sd")
    assert (found.spec.task, found.spec.loader) == ("text-to-image", "diffusers")
    assert found.spec.files == ("model_index.json", "unet/config.json", "unet/diffusion_pytorch_model.safetensors")
    assert found.weight_bytes == 100  # the single-file checkpoint beside the folders is not fetched

    def problem(value: dict) -> str | None:
        (tmp_path / "model_index.json").write_text(json.dumps(value))
        return diffusers_components_problem(tmp_path)

    assert problem(index) is None
    assert "not a Diffusers class" in problem({**index, "_class_name": "MyCustomPipeline"})
    assert "custom code" in problem({**index, "unet": ["my_unet_module", "MyUNet"]})
    assert "custom code" in problem({**index, "unet": ["os", "system"]})


def test_the_download_command_fetches_a_hub_model_ahead_of_its_first_request(hub, tmp_path, monkeypatch, capsys):
    from hugginggpt.modelhost.download import main

    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    models = tmp_path / "models"
    assert main(["--models-dir", str(models), "--hub", NER, "--dry-run"]) == 0
    assert "would fetch (token-classification, 0.1 MB of weights)" in capsys.readouterr().out
    assert main(["--models-dir", str(models), "--hub", NER, "tiny-org/remote-code", "a/../b"]) == 1
    out = capsys.readouterr()
    assert f"{NER}: in {models / NER}" in out.out
    assert "tiny-org/remote-code: refused:" in out.err and "a/../b: refused: bad model id" in out.err
    assert (models / NER / MARKER).is_file() and not (models / "tiny-org/remote-code").exists()


def test_the_fake_hub_records_requests_per_repository(hub):
    from huggingface_hub import HfApi

    HfApi(endpoint=hub.url).model_info("tiny-org/status-only", files_metadata=True)
    assert ("GET", "/api/models/tiny-org/status-only?blobs=true") in hub.repos.requests_for("tiny-org/status-only")
    assert not hub.repos.requests_for("tiny-org/status-onl")
