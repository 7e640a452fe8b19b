"""Edge cases of hugginggpt/modelhost/discover.py, each pinned where a user would notice it broken
(mutation audit: docs/TESTING.md)."""

from __future__ import annotations

import json
import logging
import os
import threading
import types
from pathlib import Path

import pytest

import hugginggpt.modelhost.discover as discover
from hugginggpt.modelhost.discover import (
    MARKER,
    Discovery,
    DiscoveryPolicy,
    DiscoveryRefused,
    HubModel,
    _LoggedProgress,
    diffusers_components_problem,
    id_problem,
    remote_code_in_files,
    select_files,
)
from hugginggpt.modelhost.registry import ModelSpec

# -- ids ------------------------------------------------------------------------------------------------------------


def test_each_part_of_an_id_is_judged_with_its_own_reason():
    assert id_problem("o" * 96 + "/" + "n" * 96) is None  # 193 characters, the longest
    assert id_problem("o" * 97 + "/" + "n" * 96) == "a model id is `owner/name`, at most 193 characters"
    assert id_problem(["a", "b"]) == "a model id is `owner/name`, at most 193 characters"
    assert id_problem("a/b/c") == "a model id is `owner/name`: one '/', no leading '/' and no deeper path"
    assert id_problem("abc") == "a model id is `owner/name`: one '/', no leading '/' and no deeper path"
    assert id_problem("/b") == "the owner is empty"
    assert id_problem("a/") == "the name is empty"
    assert id_problem("o" * 97 + "/b") == "the owner is longer than 96 characters"
    assert id_problem("a/" + "n" * 97) == "the name is longer than 96 characters"
    assert id_problem("a/-b") == ("the name may only hold letters, digits, '-', '_' and '.', and must start and end "
                                  "with a letter or digit")
    assert id_problem("a.b/c") is None and id_problem("a_/_b") is None and id_problem("x/y") is None
    assert id_problem("a..b/c") == "the owner may not contain '..' or '--'"
    assert id_problem("a/b--c") == "the name may not contain '..' or '--'"
    assert id_problem("-a/-b") == ("the owner may only hold letters, digits, '-', '_' and '.', and must start and end "
                                   "with a letter or digit")  # the owner is judged first


# -- files ----------------------------------------------------------------------------------------------------------


def test_files_outside_what_a_pipeline_reads_are_never_fetched():
    repo = ["config.json", ".gitattributes", ".cache/model.safetensors", "a/../model.safetensors", "notes.md",
            "tokenizer.model", "sp.spm", "vocab.txt", "enc.tiktoken", "model.safetensors", "sub/config.json",
            "tf/model.safetensors", "flax_model.msgpack", "model.onnx", ""]
    assert select_files(repo, "transformers") == ["config.json", "enc.tiktoken", "model.safetensors", "sp.spm",
                                                  "tokenizer.model", "vocab.txt"]
    assert select_files([".config.json", "../config.json", ".unet/config.json", "../model_index.json",
                         "unet/config.json", "model_index.json"], "diffusers") == ["model_index.json", "unet/config.json"]


def test_sentence_transformers_keep_only_their_module_folders():
    repo = ["modules.json", "1_Pooling/config.json", "2_Dense/model.safetensors", "3_x/config.json",
            "Pooling/config.json", "1_/config.json", "1_Pooling/sub/config.json", "10_Normalize/config.json"]
    assert select_files(repo, "sentence-transformers") == ["10_Normalize/config.json", "1_Pooling/config.json",
                                                           "2_Dense/model.safetensors", "3_x/config.json",
                                                           "modules.json"]
    assert select_files(repo, "transformers") == ["modules.json"]


def test_diffusers_pipelines_take_the_index_and_one_level_of_component_folders():
    repo = ["model_index.json", "single.safetensors", "notes.txt", "unet/config.json",
            "unet/diffusion_pytorch_model.safetensors", "unet/deep/x.json", "tokenizer/merges.txt"]
    assert select_files(repo, "diffusers") == ["model_index.json", "tokenizer/merges.txt", "unet/config.json",
                                               "unet/diffusion_pytorch_model.safetensors"]


def test_pytorch_weights_only_where_no_safetensors_and_only_the_models_own():
    assert select_files(["model-00001-of-00002.bin", "model-00002-of-00002.bin", "optimizer.bin",
                         "model-1-of-2.bin", "rng_state.bin"], "transformers") == [
        "model-00001-of-00002.bin", "model-00002-of-00002.bin"]
    assert select_files(["pytorch_model.fp16.bin"], "transformers") == ["pytorch_model.fp16.bin"]
    assert select_files(["optimizer.bin", "pytorch_model.bin", "config.json"], "transformers") == [
        "config.json", "pytorch_model.bin"]
    assert select_files(["diffusion_pytorch_model.bin", "sub.bin"], "transformers") == ["diffusion_pytorch_model.bin"]
    assert select_files(["x_pytorch_model.bin", "pytorch_model.binx"], "transformers") == []
    # safetensors in one folder do not take a .bin of another folder
    assert select_files(["unet/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.bin",
                         "unet/diffusion_pytorch_model.bin"], "diffusers") == [
        "unet/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.bin"]


def test_precision_variants_only_where_the_plain_weights_are_missing():
    assert select_files(["model.fp16.safetensors", "model.safetensors"], "transformers") == ["model.safetensors"]
    assert select_files(["model.fp16.safetensors", "model.ema.safetensors"], "transformers") == [
        "model.ema.safetensors", "model.fp16.safetensors"]
    for variant in ("fp16", "bf16", "fp32", "ema", "non_ema"):
        assert select_files([f"model.{variant}.safetensors", "model.safetensors"], "transformers") == [
            "model.safetensors"]
        assert select_files([f"pytorch_model.{variant}.bin", "pytorch_model.bin"], "transformers") == [
            "pytorch_model.bin"]
    assert select_files(["model.fp8.safetensors", "model.safetensors"], "transformers") == [
        "model.fp8.safetensors", "model.safetensors"]
    # a variant in another folder does not count as plain weights beside it
    assert select_files(["unet/x.fp16.safetensors", "vae/x.safetensors"], "diffusers") == [
        "unet/x.fp16.safetensors", "vae/x.safetensors"]


# -- code from the repository ---------------------------------------------------------------------------------------


def test_auto_map_anywhere_in_the_hubs_config_summary_is_remote_code(tmp_path, monkeypatch):
    fake = FakeHub(monkeypatch)
    for depth, config in enumerate([{"auto_map": {}}, {"a": {"auto_map": 1}}, {"a": [{"auto_map": 1}]},
                                    {"a": {"b": {"c": {"d": {"auto_map": 1}}}}}, {"a": [[[{"auto_map": 1}]]]}]):
        fake.add(f"o/deep{depth}", config=config)
        with pytest.raises(DiscoveryRefused) as err:
            Discovery(DiscoveryPolicy("local"), tmp_path).hub_model(f"o/deep{depth}")
        assert err.value.kind == "remote_code", depth
    fake.add("o/too-deep", config={"a": {"b": {"c": {"d": {"e": {"auto_map": 1}}}}}})  # past what the Hub nests
    fake.add("o/too-deep-in-lists", config={"a": [[[[{"auto_map": 1}]]]]})
    fake.add("o/list", config={"a": ["auto_map"]})
    fake.add("o/none", config=None)
    for mid in ("o/too-deep", "o/too-deep-in-lists", "o/list", "o/none"):
        assert Discovery(DiscoveryPolicy("local"), tmp_path).hub_model(mid).spec.id == mid


def test_the_config_asking_for_code_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": "x.T"}}))
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "list.json").write_text(json.dumps(["auto_map"]))
    (tmp_path / "vocab.txt").write_text('{"auto_map": 1}')
    assert remote_code_in_files(tmp_path, ["config.json", "missing.json", "broken.json", "list.json", "vocab.txt"]) is None
    assert remote_code_in_files(tmp_path, ["config.json", "tokenizer_config.json"]) == (
        "its tokenizer_config.json has `auto_map`: it runs code from the repository (trust_remote_code), never "
        "done here")
    # a file that is not JSON, missing or broken is passed over, never the end of the search
    assert remote_code_in_files(tmp_path, ["vocab.txt", "missing.json", "broken.json", "tokenizer_config.json"]) == (
        "its tokenizer_config.json has `auto_map`: it runs code from the repository (trust_remote_code), never "
        "done here")


def index_problem(folder: Path, index) -> str | None:
    (folder / "model_index.json").write_text(json.dumps(index))
    return diffusers_components_problem(folder)


def test_a_diffusers_index_is_read_component_by_component(tmp_path):
    assert diffusers_components_problem(tmp_path) == (
        "it has no readable model_index.json, which a Diffusers pipeline needs")
    (tmp_path / "model_index.json").write_text("{")
    assert diffusers_components_problem(tmp_path) == (
        "it has no readable model_index.json, which a Diffusers pipeline needs")
    good = {"_class_name": "StableDiffusionPipeline", "_diffusers_version": "0.30.0", "safety_checker": None,
            "feature_extractor": [None, None], "unet": ["diffusers", "UNet2DConditionModel"],
            "text_encoder": ["transformers", "CLIPTextModel"], "scheduler": ["stable_diffusion", "X"]}
    assert index_problem(tmp_path, good) is None
    assert index_problem(tmp_path, {"_class_name": "MyPipe"}) == (
        "its pipeline class 'MyPipe' is not a Diffusers class (custom pipeline code)")
    assert index_problem(tmp_path, {"unet": ["diffusers", "X"]}) == (
        "its pipeline class None is not a Diffusers class (custom pipeline code)")
    for bad in (["diffusers"], ["diffusers", "X", "Y"], "diffusers", ["diffusers", 3], [None, "X"]):
        assert index_problem(tmp_path, {**good, "vae": bad}) == "its component 'vae' is not a [library, class] pair"
    assert index_problem(tmp_path, {**good, "vae": ["my-lib", "VAE"]}) == (
        "its component 'vae' comes from 'my-lib', not Diffusers or Transformers (custom code)")
    assert index_problem(tmp_path, {**good, "vae": ["no_such_pipeline", "VAE"]}) == (
        "its component 'vae' comes from 'no_such_pipeline', not Diffusers or Transformers (custom code)")


def test_an_index_that_is_not_a_mapping_is_refused(tmp_path):
    assert index_problem(tmp_path, ["StableDiffusionPipeline"]) == (
        "its pipeline class None is not a Diffusers class (custom pipeline code)")


# -- refusals and the policy ----------------------------------------------------------------------------------------


def test_a_refusal_is_unprocessable_by_default():
    refused = DiscoveryRefused("no")
    assert (str(refused), refused.status, refused.kind) == ("no", 422, "not_servable")
    assert DiscoveryPolicy().mode == "hosted" and not Discovery(DiscoveryPolicy(), Path("x")).enabled
    assert Discovery(DiscoveryPolicy("local"), Path("x")).enabled


def test_author_refusals_name_the_author_and_the_list():
    policy = DiscoveryPolicy("local", allow=("Google", "tiny-org"), deny=("evil",))
    assert policy.author_problem("EVIL/x") == "EVIL/x: its author 'EVIL' is on discovered_authors_deny"
    assert policy.author_problem("other/x") == (
        "other/x: its author 'other' is not on discovered_authors_allow (Google, tiny-org)")
    assert policy.author_problem("google/x") is None
    assert DiscoveryPolicy("local").author_problem("anyone/x") is None


def test_the_policy_is_checked_before_the_disk_or_the_hub(tmp_path):
    off = Discovery(DiscoveryPolicy("off"), tmp_path)
    with pytest.raises(DiscoveryRefused) as err:
        off.check_policy("a/b")
    assert (err.value.status, err.value.kind) == (404, "not_enabled")
    assert str(err.value) == ("unknown model 'a/b': discovered_models is 'off' on this server (set it to local to run "
                              "Hub models here)")
    d = Discovery(DiscoveryPolicy("local", deny=("bad",)), tmp_path, curated_ids=["cur/ated"])
    with pytest.raises(DiscoveryRefused) as err:
        d.check_policy("cur/ated")
    assert (err.value.status, err.value.kind) == (404, "curated_elsewhere")
    assert str(err.value) == "cur/ated is in the curated catalog at another deployment level; see GET /models"
    with pytest.raises(DiscoveryRefused) as err:
        d.check_policy("bad/x")
    assert (err.value.status, err.value.kind, str(err.value)) == (
        403, "author_denied", "bad/x: its author 'bad' is on discovered_authors_deny")
    with pytest.raises(DiscoveryRefused) as err:
        d.check_policy("bad/../x")
    assert (err.value.status, err.value.kind) == (400, "bad_model_id")
    assert d.check_policy("good/x") is None


def test_a_bad_id_is_quoted_short_in_the_refusal(tmp_path):
    d = Discovery(DiscoveryPolicy("local"), tmp_path)
    with pytest.raises(DiscoveryRefused) as err:
        d.folder("x" * 300)
    assert str(err.value) == f"bad model id {'x' * 200!r}: a model id is `owner/name`, at most 193 characters"
    assert d.folder("a/b") == tmp_path.resolve() / "a" / "b"


def test_a_folder_that_links_out_of_the_models_folder_is_refused(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "models" / "owner")
    with pytest.raises(DiscoveryRefused) as err:
        Discovery(DiscoveryPolicy("local"), tmp_path / "models").folder("owner/x")
    assert (err.value.status, err.value.kind) == (400, "bad_model_id")
    assert str(err.value) == "bad model id 'owner/x': it leaves the models folder"


# -- the Hub's facts, judged (a fake HfApi: every field under the test's control) -------------------------------------


def info(**fields):
    base = {"gated": False, "disabled": False, "private": False, "library_name": "transformers",
            "pipeline_tag": "text-classification", "tags": [], "config": {}, "sha": "0123456789abcdef0123",
            "siblings": [types.SimpleNamespace(rfilename="config.json", size=10),
                         types.SimpleNamespace(rfilename="model.safetensors", size=3 * 2**20)]}
    base.update(fields)
    if isinstance(base["siblings"], dict):
        base["siblings"] = [types.SimpleNamespace(rfilename=k, size=v) for k, v in base["siblings"].items()]
    return types.SimpleNamespace(**base)


class FakeHub:
    """huggingface_hub.HfApi replaced: model_info answers from `models` (an exception is raised)."""

    def __init__(self, monkeypatch):
        import huggingface_hub

        self.models: dict[str, object] = {}
        self.asked: list[tuple] = []
        hub = self

        class Api:
            def __init__(self, endpoint=None, token=None):
                self.where = (endpoint, token)

            def model_info(self, model_id, files_metadata=False, timeout=None):
                hub.asked.append((model_id, self.where, files_metadata, timeout))
                answer = hub.models[model_id]
                if isinstance(answer, BaseException):
                    raise answer
                return answer

        monkeypatch.setattr(huggingface_hub, "HfApi", Api)

    def add(self, model_id: str, **fields) -> None:
        self.models[model_id] = info(**fields)


def refusal(d: Discovery, model_id: str) -> DiscoveryRefused:
    with pytest.raises(DiscoveryRefused) as err:
        d.hub_model(model_id)
    return err.value


def http_error(cls, status: int):
    response = types.SimpleNamespace(status_code=status, headers={}, request=None)
    return cls("nope", response=response)


def test_hub_errors_become_refusals_with_their_own_status(tmp_path, monkeypatch):
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    hub = FakeHub(monkeypatch)
    hub.models.update({"o/gated": http_error(GatedRepoError, 403), "o/none": http_error(RepositoryNotFoundError, 404),
                       "o/busy": http_error(HfHubHTTPError, 503), "o/offline": ConnectionError("dns")})
    d = Discovery(DiscoveryPolicy("local"), tmp_path, endpoint="http://hub.test", token="hf_x", timeout=7.5)
    r = refusal(d, "o/gated")
    assert (r.status, r.kind, str(r)) == (403, "gated", "o/gated is gated on the Hub: accept its terms there and add "
                                                        "it to the curated catalog instead")
    r = refusal(d, "o/none")
    assert (r.status, r.kind, str(r)) == (404, "not_on_hub", "o/none is not a model on the Hub (or it is private to "
                                                             "another account)")
    r = refusal(d, "o/busy")
    assert (r.status, r.kind, str(r)) == (502, "hub_error", "the Hub answered HTTP 503 for o/busy")
    r = refusal(d, "o/offline")
    assert (r.status, r.kind, str(r)) == (502, "hub_unreachable",
                                          "the Hub cannot be reached to look up o/offline (ConnectionError)")
    assert r.__cause__ is None and r.__suppress_context__
    assert hub.asked[0] == ("o/gated", ("http://hub.test", "hf_x"), True, 7.5)


def test_models_the_hub_holds_back_are_refused(tmp_path, monkeypatch):
    hub = FakeHub(monkeypatch)
    hub.add("o/gated", gated="auto")
    hub.add("o/disabled", disabled=True, private=True)
    hub.add("o/private", private=True)
    d = Discovery(DiscoveryPolicy("local"), tmp_path)
    r = refusal(d, "o/gated")
    assert (r.status, r.kind, str(r)) == (403, "gated", "o/gated is gated on the Hub (auto): its terms must be "
                                                        "accepted by a person, so it is not downloaded automatically")
    r = refusal(d, "o/disabled")
    assert (r.status, r.kind, str(r)) == (403, "not_public", "o/disabled is disabled on the Hub")
    assert str(refusal(d, "o/private")) == "o/private is private on the Hub"


def test_without_a_generic_loader_the_refusal_lists_what_loads(tmp_path, monkeypatch):
    hub = FakeHub(monkeypatch)
    hub.add("o/rl", library_name="stable-baselines3", pipeline_tag="reinforcement-learning")
    hub.add("o/bare", library_name=None, pipeline_tag=None)
    d = Discovery(DiscoveryPolicy("local"), tmp_path)
    r = refusal(d, "o/rl")
    assert (r.status, r.kind) == (422, "no_generic_loader")
    assert str(r).startswith("o/rl is a stable-baselines3 model for reinforcement-learning, which has no generic loader "
                             "here (loadable: diffusers/text-to-image, sentence-transformers/sentence-similarity, "
                             "transformers/audio-classification, transformers/automatic-speech-recognition, ")
    assert str(r).endswith(", transformers/visual-question-answering)")
    assert str(refusal(d, "o/bare")).startswith("o/bare is a no-library model for no pipeline tag, which has no")


@pytest.mark.parametrize("library, tag, task, loader, pipeline_task", [
    ("transformers", "token-classification", "token-classification", "pipeline", "token-classification"),
    ("transformers", "text-classification", "text-classification", "pipeline", "text-classification"),
    ("transformers", "text-generation", "text-generation", "pipeline", "text-generation"),
    ("transformers", "image-classification", "image-classification", "pipeline", "image-classification"),
    ("transformers", "object-detection", "object-detection", "pipeline", "object-detection"),
    ("transformers", "image-segmentation", "image-segmentation", "pipeline", "image-segmentation"),
    ("transformers", "depth-estimation", "depth-estimation", "pipeline", "depth-estimation"),
    ("transformers", "document-question-answering", "document-question-answering", "pipeline",
     "document-question-answering"),
    ("transformers", "automatic-speech-recognition", "automatic-speech-recognition", "pipeline",
     "automatic-speech-recognition"),
    ("transformers", "audio-classification", "audio-classification", "pipeline", "audio-classification"),
    ("transformers", "summarization", "summarization", "seq2seq", None),
    ("transformers", "translation", "translation", "seq2seq", None),
    ("transformers", "text2text-generation", "text2text-generation", "seq2seq", None),
    ("transformers", "question-answering", "question-answering", "extractive-qa", None),
    ("transformers", "image-to-text", "image-to-text", "vision2seq", None),
    ("transformers", "visual-question-answering", "visual-question-answering", "vqa", None),
    ("transformers", "text-to-speech", "text-to-speech", "pipeline", "text-to-audio"),
    ("transformers", "text-to-audio", "text-to-speech", "pipeline", "text-to-audio"),
    ("sentence-transformers", "sentence-similarity", "sentence-similarity", "sentence-embedding", None),
    ("diffusers", "text-to-image", "text-to-image", "diffusers", None),
])
def test_each_hub_library_and_tag_gets_the_loader_its_handler_expects(tmp_path, monkeypatch, library, tag, task,
                                                                     loader, pipeline_task):
    hub = FakeHub(monkeypatch)
    siblings = {"model_index.json": 10, "unet/diffusion_pytorch_model.safetensors": 100} if library == "diffusers" \
        else {"config.json": 10, "model.safetensors": 100}
    hub.add("o/m", library_name=library, pipeline_tag=tag, siblings=siblings)
    found = Discovery(DiscoveryPolicy("local"), tmp_path).hub_model("o/m")
    assert (found.spec.task, found.spec.loader, found.spec.pipeline_task) == (task, loader, pipeline_task)
    assert (found.library, found.pipeline_tag) == (library, tag)


def test_a_model_for_the_hub_pins_its_commit_and_its_files(tmp_path, monkeypatch):
    hub = FakeHub(monkeypatch)
    hub.add("o/m", sha="feedface" * 5, siblings={"config.json": 10, "model.safetensors": 5 * 2**20, "README.md": 99})
    found = Discovery(DiscoveryPolicy("local"), tmp_path).hub_model("o/m")
    assert found == HubModel(ModelSpec("o/m", "text-classification", "pipeline", "standard", "text-classification",
                                       files=("config.json", "model.safetensors"), source="hub"),
                             "feedface" * 5, "transformers", "text-classification", 5 * 2**20)


def test_code_weights_and_size_are_judged_from_the_hubs_facts(tmp_path, monkeypatch):
    hub = FakeHub(monkeypatch)
    hub.add("o/custom", tags=["custom_code"])
    hub.add("o/tagless", tags=None)
    hub.add("o/no-weights", siblings={"config.json": 10, "model.onnx": 100})
    hub.add("o/no-siblings", siblings=None)
    hub.add("o/unsized", siblings={"config.json": None, "a.safetensors": 100, "b.safetensors": None})
    hub.add("o/exact", siblings={"model.safetensors": 3 * 2**20})
    hub.add("o/over", siblings={"model.safetensors": 3 * 2**20 + 1})
    hub.add("o/no-sha", sha=None)
    d = Discovery(DiscoveryPolicy("local"), tmp_path)
    r = refusal(d, "o/custom")
    assert (r.status, r.kind, str(r)) == (422, "remote_code", "o/custom needs code from its repository (`auto_map` / "
                                                              "custom_code): trust_remote_code is never used here")
    assert d.hub_model("o/tagless").weight_bytes == 3 * 2**20
    r = refusal(d, "o/no-weights")
    assert (r.status, r.kind, str(r)) == (422, "no_weights",
                                          "o/no-weights has no safetensors or PyTorch weights a pipeline can read")
    assert refusal(d, "o/no-siblings").kind == "no_weights"
    assert d.hub_model("o/unsized").weight_bytes is None  # one weight of unknown size: the sum is unknown
    assert d.hub_model("o/over").weight_bytes == 3 * 2**20 + 1  # no cap
    capped = Discovery(DiscoveryPolicy("local", max_size_mb=3), tmp_path)
    r = refusal(capped, "o/unsized")
    assert (r.status, r.kind, str(r)) == (422, "size_unknown", "o/unsized: the Hub does not give its weights' size, "
                                                               "and max_model_size_mb (3) is set")
    assert capped.hub_model("o/exact").weight_bytes == 3 * 2**20
    r = refusal(capped, "o/over")
    assert (r.status, r.kind, str(r)) == (422, "too_large", "o/over: its weights are 3 MB, over max_model_size_mb (3)")
    r = refusal(Discovery(DiscoveryPolicy("local", max_size_mb=0.5), tmp_path), "o/exact")
    assert str(r) == "o/exact: its weights are 3 MB, over max_model_size_mb (0.5)"
    r = refusal(d, "o/no-sha")
    assert (r.status, r.kind, str(r)) == (502, "hub_error", "the Hub gave no commit for o/no-sha")


def test_verdicts_are_remembered_and_hub_failures_only_briefly(tmp_path, monkeypatch):
    hub = FakeHub(monkeypatch)
    hub.add("o/m")
    hub.add("o/gated", gated="manual")
    hub.models["o/down"] = ConnectionError("offline")
    d = Discovery(DiscoveryPolicy("local"), tmp_path, info_ttl=600, error_ttl=-1)
    first = d.hub_model("o/m")
    assert d.hub_model("o/m") is first
    assert refusal(d, "o/gated") is refusal(d, "o/gated")
    assert refusal(d, "o/down") is not refusal(d, "o/down")  # a Hub failure is asked again
    assert [a[0] for a in hub.asked] == ["o/m", "o/gated", "o/down", "o/down"]
    stale = Discovery(DiscoveryPolicy("local"), tmp_path, info_ttl=-1, error_ttl=600)
    stale.hub_model("o/m")
    stale.hub_model("o/m")
    refusal(stale, "o/down")
    refusal(stale, "o/down")
    assert [a[0] for a in hub.asked[4:]] == ["o/m", "o/m", "o/down"]


def test_a_refusal_of_status_500_counts_as_a_hub_failure(tmp_path, monkeypatch):
    d = Discovery(DiscoveryPolicy("local"), tmp_path, info_ttl=600, error_ttl=-1)
    calls = []

    def judge(model_id):
        calls.append(model_id)
        raise DiscoveryRefused("the Hub broke", 500, "hub_error")

    monkeypatch.setattr(d, "_judge", judge)
    refusal(d, "o/m")
    refusal(d, "o/m")
    assert calls == ["o/m", "o/m"]


def test_the_verdict_cache_forgets_the_least_recently_asked(tmp_path, monkeypatch):
    hub = FakeHub(monkeypatch)
    for mid in ("o/a", "o/b", "o/c"):
        hub.add(mid)
    d = Discovery(DiscoveryPolicy("local"), tmp_path, max_cached=2)
    d.hub_model("o/a")
    d.hub_model("o/b")
    d.hub_model("o/a")  # a is the most recent now
    d.hub_model("o/c")  # b goes
    hub.asked.clear()
    d.hub_model("o/a")
    d.hub_model("o/c")
    assert hub.asked == []
    d.hub_model("o/b")
    assert [a[0] for a in hub.asked] == ["o/b"]


# -- on disk, status, download --------------------------------------------------------------------------------------


class FakeDownloads:
    """The `downloader` of Discovery: writes each requested file of `files` into local_dir, records the call."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.calls: list[dict] = []
        self.during = None  # called inside each download

    def __call__(self, **kwargs):
        import fnmatch

        self.calls.append(kwargs)
        if self.during is not None:
            self.during()
        for name, data in self.files.items():
            if any(fnmatch.fnmatchcase(name, p) for p in kwargs["allow_patterns"]):
                target = Path(kwargs["local_dir"]) / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)


def hub_with(monkeypatch, model_id="o/m", **fields) -> FakeHub:
    hub = FakeHub(monkeypatch)
    hub.add(model_id, **fields)
    return hub


def test_a_download_fetches_configs_then_weights_at_the_pinned_commit(tmp_path, monkeypatch, caplog):
    hub_with(monkeypatch, sha="abcdef0123456789" * 2, siblings={"config.json": 10, "model.safetensors": 3 * 2**20,
                                                                 "voc[ab]*?.txt": 5})
    files = {"config.json": b"{}", "model.safetensors": b"w" * 100, "voc[ab]*?.txt": b"v", "vocab.txt": b"not it"}
    downloads = FakeDownloads(files)
    d = Discovery(DiscoveryPolicy("local"), tmp_path, endpoint="http://hub.test", token="hf_t", downloader=downloads)
    seen = []
    downloads.during = lambda: seen.append((set(d.active), d.status("o/m").get("downloading")))
    with caplog.at_level(logging.INFO, logger=discover.__name__):
        spec = d.ensure("o/m")
    assert [c["allow_patterns"] for c in downloads.calls] == [["config.json", "voc[[]ab[]][*][?].txt"],
                                                              ["model.safetensors"]]
    for call in downloads.calls:
        assert (call["repo_id"], call["revision"], call["local_dir"]) == ("o/m", "abcdef0123456789" * 2,
                                                                          str(tmp_path.resolve() / "o/m"))
        assert (call["endpoint"], call["token"]) == ("http://hub.test", "hf_t")
        assert issubclass(call["tqdm_class"], __import__("tqdm").tqdm)
    assert not (tmp_path / "o/m/vocab.txt").exists()  # names, not patterns
    assert seen == [({"o/m"}, True), ({"o/m"}, True)] and d.active == set() and d.downloads == 1
    assert "downloading" not in d.status("o/m")
    assert spec == ModelSpec("o/m", "text-classification", "pipeline", "standard", "text-classification",
                             files=("config.json", "model.safetensors", "voc[ab]*?.txt"), source="hub")
    marker = json.loads((tmp_path / "o/m" / MARKER).read_text())
    assert {k: v for k, v in marker.items() if k != "downloaded_at"} == {
        "id": "o/m", "sha": "abcdef0123456789" * 2, "library": "transformers", "pipeline_tag": "text-classification",
        "weight_bytes": 3 * 2**20, "task": "text-classification", "loader": "pipeline",
        "pipeline_task": "text-classification", "files": ["config.json", "model.safetensors", "voc[ab]*?.txt"]}
    assert isinstance(marker["downloaded_at"], float)
    assert not (tmp_path / "o/m" / (MARKER + ".tmp")).exists()
    logged = [r.getMessage() for r in caplog.records]
    assert logged[0] == (f"o/m: not curated; downloading 3 files (3.0 MB of weights) at abcdef012345 from the Hub into "
                         f"{tmp_path.resolve() / 'o/m'}")
    assert logged[1].startswith("o/m: downloaded in ") and logged[1].endswith("s")
    assert d.ensure("o/m") == spec and len(downloads.calls) == 2  # on disk now
    monkeypatch.setattr(_LoggedProgress, "every", 0.0)
    with caplog.at_level(logging.INFO, logger=discover.__name__):
        bar = downloads.calls[1]["tqdm_class"](total=10**6, unit="B", desc="model.safetensors")
        bar.update(10**6)
        bar.close()
    assert caplog.records[-1].getMessage() == "o/m: 1.0 of 1.0 MB downloaded"  # the Hub's bars name the model


def test_a_model_on_disk_needs_no_hub_and_one_download_does_not_hold_up_another(tmp_path, monkeypatch):
    import threading

    hub = hub_with(monkeypatch, siblings={"model.safetensors": 10})
    hub.add("o/n", siblings={"model.safetensors": 10})
    started, release = threading.Event(), threading.Event()

    class SlowForOM(FakeDownloads):
        def __call__(self, **kwargs):
            if kwargs["repo_id"] == "o/m":
                started.set()
                release.wait(30)
            super().__call__(**kwargs)

    d = Discovery(DiscoveryPolicy("local"), tmp_path, downloader=SlowForOM({"model.safetensors": b"w"}))
    slow = threading.Thread(target=d.ensure, args=("o/m",), daemon=True)
    slow.start()
    try:
        assert started.wait(30)
        other = threading.Thread(target=d.ensure, args=("o/n",), daemon=True)
        other.start()
        other.join(10)  # milliseconds, unless it waits for o/m's download
        assert not other.is_alive() and (tmp_path / "o/n" / MARKER).is_file()
    finally:
        release.set()
        slow.join(30)
    hub.models["o/m"] = OSError("offline")  # on disk now: after a restart, served without asking the Hub
    asked = len(hub.asked)
    assert Discovery(DiscoveryPolicy("local"), tmp_path).ensure("o/m").id == "o/m" and len(hub.asked) == asked


def test_a_download_of_unknown_size_says_so(tmp_path, monkeypatch, caplog):
    hub_with(monkeypatch, siblings={"model.safetensors": None})
    d = Discovery(DiscoveryPolicy("local"), tmp_path, downloader=FakeDownloads({"model.safetensors": b"w"}))
    with caplog.at_level(logging.INFO, logger=discover.__name__):
        spec = d.ensure("o/m")
    assert spec.files == ("model.safetensors",)
    assert caplog.records[0].getMessage().startswith("o/m: not curated; downloading 1 files (size unknown) at ")


def test_the_status_of_a_model_not_yet_downloaded(tmp_path, monkeypatch):
    hub = hub_with(monkeypatch, siblings={"model.safetensors": 1_625_000})  # 1.549... MiB
    hub.add("o/unsized", siblings={"model.safetensors": None})
    d = Discovery(DiscoveryPolicy("local"), tmp_path, downloader=FakeDownloads({"model.safetensors": b"w"}))
    assert d.status("o/m") == {"loaded": False, "loadable": True, "discovered": True, "task": "text-classification",
                               "size_mb": 1.5}
    assert d.status("o/unsized") == {"loaded": False, "loadable": True, "discovered": True,
                                     "task": "text-classification"}
    d.ensure("o/m")
    assert d.status("o/m") == {"loaded": True, "loadable": True, "discovered": True}
    assert d.status("o/../x")["kind"] == "bad_model_id"
    assert Discovery(DiscoveryPolicy("off"), tmp_path).status("o/m") == {
        "loaded": False, "loadable": False, "discovered": True, "kind": "not_enabled",
        "problem": "unknown model 'o/m': discovered_models is 'off' on this server (set it to local to run Hub "
                   "models here)"}


def test_configs_asking_for_code_stop_the_download_and_are_remembered(tmp_path, monkeypatch):
    hub = hub_with(monkeypatch)
    files = {"config.json": json.dumps({"auto_map": {"AutoModel": "m.M"}}).encode(), "model.safetensors": b"w"}
    downloads = FakeDownloads(files)
    d = Discovery(DiscoveryPolicy("local"), tmp_path, downloader=downloads)
    with pytest.raises(DiscoveryRefused) as err:
        d.ensure("o/m")
    assert (err.value.status, err.value.kind) == (422, "remote_code")
    assert str(err.value) == ("o/m: its config.json has `auto_map`: it runs code from the repository "
                              "(trust_remote_code), never done here")
    assert len(downloads.calls) == 1 and not (tmp_path / "o/m/model.safetensors").exists()
    assert d.active == set() and d.downloads == 0
    assert d.status("o/m")["kind"] == "remote_code" and len(hub.asked) == 1  # remembered, not asked again


def test_a_diffusers_pipeline_with_foreign_components_stops_before_the_weights(tmp_path, monkeypatch):
    siblings = {"model_index.json": 10, "unet/diffusion_pytorch_model.safetensors": 100}
    hub_with(monkeypatch, library_name="diffusers", pipeline_tag="text-to-image", siblings=siblings)
    index = {"_class_name": "StableDiffusionPipeline", "unet": ["my_lib", "UNet"]}
    downloads = FakeDownloads({"model_index.json": json.dumps(index).encode(),
                               "unet/diffusion_pytorch_model.safetensors": b"w"})
    d = Discovery(DiscoveryPolicy("local"), tmp_path, downloader=downloads)
    with pytest.raises(DiscoveryRefused) as err:
        d.ensure("o/m")
    assert (err.value.status, err.value.kind) == (422, "remote_code")
    assert str(err.value) == "o/m: its component 'unet' comes from 'my_lib', not Diffusers or Transformers (custom code)"
    assert len(downloads.calls) == 1
    index["unet"] = ["diffusers", "UNet2DConditionModel"]
    downloads.files["model_index.json"] = json.dumps(index).encode()
    (tmp_path / "o/m/model_index.json").unlink()
    spec = Discovery(DiscoveryPolicy("local"), tmp_path, downloader=downloads).ensure("o/m")
    assert spec.loader == "diffusers" and (tmp_path / "o/m/unet/diffusion_pytorch_model.safetensors").is_file()


def test_a_download_that_lacks_files_is_a_bad_gateway(tmp_path, monkeypatch):
    names = [f"f{i}.json" for i in range(7)]
    hub_with(monkeypatch, siblings={**dict.fromkeys(names, 1), "model.safetensors": 100})
    downloads = FakeDownloads({"model.safetensors": b"w"})
    d = Discovery(DiscoveryPolicy("local"), tmp_path, downloader=downloads)
    with pytest.raises(DiscoveryRefused) as err:
        d.ensure("o/m")
    assert (err.value.status, err.value.kind) == (502, "download_failed")
    assert str(err.value) == "o/m: the download lacks f0.json, f1.json, f2.json, f3.json, f4.json"
    assert not (tmp_path / "o/m" / MARKER).exists() and d.downloads == 0 and d.active == set()


def test_a_failing_download_is_reported_in_one_line(tmp_path, monkeypatch, caplog):
    hub_with(monkeypatch)
    d = Discovery(DiscoveryPolicy("local"), tmp_path, downloader=FakeDownloads({}))

    def broken(**kwargs):
        raise OSError("disk full\nsecond line " + "x" * 400)

    d._download = broken  # noqa: SLF001
    with caplog.at_level(logging.INFO, logger=discover.__name__), pytest.raises(DiscoveryRefused) as err:
        d.ensure("o/m")
    assert (err.value.status, err.value.kind) == (502, "download_failed")
    assert str(err.value) == ("downloading o/m from the Hub failed before any weights arrived, with config.json, "
                              "model.safetensors not downloaded (OSError: disk full)")
    assert err.value.__cause__ is None and err.value.__suppress_context__
    warning = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and warning[0].getMessage() == ("o/m: download failed: OSError: " + (
        "disk full\nsecond line " + "x" * 400)[:300])
    assert d.active == set()

    def silent(**kwargs):
        raise RuntimeError()

    d._download = silent  # noqa: SLF001
    with pytest.raises(DiscoveryRefused) as err:
        d.ensure("o/m")
    assert str(err.value) == ("downloading o/m from the Hub failed before any weights arrived, with config.json, "
                              "model.safetensors not downloaded (RuntimeError: )")
    long = "y" * 250

    def wordy(**kwargs):
        raise RuntimeError(long)

    d._download = wordy  # noqa: SLF001
    with pytest.raises(DiscoveryRefused) as err:
        d.ensure("o/m")
    assert str(err.value) == (f"downloading o/m from the Hub failed before any weights arrived, with config.json, "
                              f"model.safetensors not downloaded (RuntimeError: {'y' * 200})")


def test_a_download_whose_files_vanish_is_an_internal_error(tmp_path, monkeypatch):
    hub_with(monkeypatch)
    d = Discovery(DiscoveryPolicy("local"), tmp_path, downloader=FakeDownloads({"config.json": b"{}",
                                                                                "model.safetensors": b"w"}))
    monkeypatch.setattr(d, "on_disk", lambda model_id: None)
    with pytest.raises(DiscoveryRefused) as err:
        d.ensure("o/m")
    assert (err.value.status, err.value.kind) == (500, "download_failed")
    assert str(err.value) == f"o/m was downloaded but its files are not all in {tmp_path.resolve() / 'o/m'}"
    assert d.downloads == 1


def test_the_real_snapshot_download_is_used_without_a_downloader(tmp_path, monkeypatch):
    import huggingface_hub

    hub_with(monkeypatch)
    calls = []

    def snapshot_download(**kwargs):
        calls.append(kwargs["allow_patterns"])
        FakeDownloads({"config.json": b"{}", "model.safetensors": b"w"})(**kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert Discovery(DiscoveryPolicy("local"), tmp_path).ensure("o/m").id == "o/m"
    assert calls == [["config.json"], ["model.safetensors"]]


def test_a_model_of_weights_alone_downloads_in_one_step(tmp_path, monkeypatch):
    hub = hub_with(monkeypatch, siblings={"model.safetensors": 100})
    hub.add("o/n", siblings={"model.safetensors": 100})
    downloads = FakeDownloads({"model.safetensors": b"w"})
    d = Discovery(DiscoveryPolicy("local"), tmp_path, downloader=downloads)
    d.ensure("o/m")
    assert [c["allow_patterns"] for c in downloads.calls] == [["model.safetensors"]]
    d.ensure("o/n")
    assert d.downloads == 2 and [s.id for s in d.listed()] == ["o/m", "o/n"]


def write_marker(folder: Path, **marker) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text(json.dumps(marker))


def test_only_complete_downloads_are_on_disk(tmp_path):
    d = Discovery(DiscoveryPolicy("off"), tmp_path / "models")
    assert d.listed() == []  # no models folder yet
    root = tmp_path / "models"
    good = {"task": "summarization", "loader": "seq2seq", "files": ["config.json"]}
    write_marker(root / "o/good", id="o/good", **good)
    (root / "o/good/config.json").write_text("{}")
    write_marker(root / "o/typed", id="o/typed", pipeline_task="text-classification", task="text-classification",
                 loader="pipeline", files=["config.json"])
    (root / "o/typed/config.json").write_text("{}")
    write_marker(root / "o/missing-file", id="o/missing-file", **good)
    write_marker(root / "o/other-id", id="o/good", **good)
    (root / "o/other-id/config.json").write_text("{}")
    write_marker(root / "o/no-task", id="o/no-task", loader="seq2seq", files=[])
    (root / "o/broken").mkdir()
    (root / "o/broken" / MARKER).write_text("{")
    write_marker(root / "o/no-files", id="o/no-files", task="x", loader="y", files=None)
    (root / "o/not-a-dict").mkdir()
    (root / "o/not-a-dict" / MARKER).write_text("[1]")
    assert d.on_disk("o/good") == ModelSpec("o/good", "summarization", "seq2seq", "standard", None,
                                            files=("config.json",), source="hub")
    assert d.on_disk("o/typed").pipeline_task == "text-classification"
    for mid in ("o/missing-file", "o/other-id", "o/no-task", "o/broken", "o/no-files", "o/not-a-dict", "o/absent",
                "o/.."):
        assert d.on_disk(mid) is None, mid
    assert [s.id for s in d.listed()] == ["o/good", "o/typed"]


def test_one_download_per_model_at_a_time(tmp_path, monkeypatch):
    hub_with(monkeypatch)
    downloads = FakeDownloads({"config.json": b"{}", "model.safetensors": b"w"})
    d = Discovery(DiscoveryPolicy("local"), tmp_path, downloader=downloads)
    inside, go = threading.Event(), threading.Event()

    def first_blocks():
        if len(downloads.calls) == 1:
            inside.set()
            go.wait(30)

    downloads.during = first_blocks
    results = []
    first = threading.Thread(target=lambda: results.append(d.ensure("o/m")))
    first.start()
    assert inside.wait(30)
    second = threading.Thread(target=lambda: results.append(d.ensure("o/m")))
    second.start()
    go.set()
    first.join(30)
    second.join(30)
    assert len(results) == 2 and results[0] == results[1] and d.downloads == 1 and len(downloads.calls) == 2


# -- progress in the log ----------------------------------------------------------------------------------------------


def test_download_progress_is_logged_in_megabytes(monkeypatch, caplog):
    monkeypatch.setattr(_LoggedProgress, "every", 0.0)
    progress = _LoggedProgress.for_model("o/m")
    with caplog.at_level(logging.INFO, logger=discover.__name__):
        bar = progress(total=4_000_000, unit="B", desc="model.safetensors", name="ignored")
        bar.update(1_500_000)
        bar.update()
        stream = bar.fp
        bar.close()
        quiet = [progress(total=None, unit="B"), progress(total=10, unit="it"),
                 progress(total=4_000_000, unit="B", desc="Reconstructing model.safetensors")]
        for other in quiet:
            other.update(10)
            other.close()
        monkeypatch.setattr(_LoggedProgress, "every", 3600.0)
        slow = progress(total=4_000_000, unit="B")
        slow.update(10)
        slow.close()
    assert [r.getMessage() for r in caplog.records] == ["o/m: 1.5 of 4.0 MB downloaded",
                                                        "o/m: 1.5 of 4.0 MB downloaded"]
    assert stream.closed and stream.name == os.devnull


def test_progress_counts_like_tqdm_and_says_megabytes_of_a_million_bytes(monkeypatch, caplog):
    monkeypatch.setattr(_LoggedProgress, "every", 0.0)
    progress = _LoggedProgress.for_model("o/m")
    files = progress(["a.json", "b.json"], total=2, desc="Fetching 2 files")  # how snapshot_download's map calls it
    assert list(files) == ["a.json", "b.json"] and files.n == 2
    files.close()
    with caplog.at_level(logging.INFO, logger=discover.__name__):
        bar = progress(total=10**12, unit="B")
        bar.update()
        assert bar.n == 1
        bar.update(10**12 - 1)
        bar.close()
    assert [r.getMessage() for r in caplog.records] == ["o/m: 0.0 of 1000000.0 MB downloaded",
                                                        "o/m: 1000000.0 of 1000000.0 MB downloaded"]


def test_progress_is_kept_even_where_bars_are_turned_off(monkeypatch, caplog):
    monkeypatch.setattr(_LoggedProgress, "every", 0.0)
    with caplog.at_level(logging.INFO, logger=discover.__name__):
        bar = _LoggedProgress.for_model("o/m")(total=2_000_000, unit="B", disable=True)
        bar.update(2_000_000)
        bar.close()
    assert [r.getMessage() for r in caplog.records] == ["o/m: 2.0 of 2.0 MB downloaded"]


class Clock:
    """discover's `time` module replaced: monotonic() is what the test says it is."""

    def __init__(self, monkeypatch):
        import time

        self.now = 1000.0
        monkeypatch.setattr(discover, "time", types.SimpleNamespace(monotonic=lambda: self.now, time=time.time))


def test_verdicts_last_ten_minutes_and_hub_failures_thirty_seconds(tmp_path, monkeypatch):
    hub = FakeHub(monkeypatch)
    hub.add("o/m")
    hub.models["o/down"] = ConnectionError("offline")
    clock = Clock(monkeypatch)
    d = Discovery(DiscoveryPolicy("local"), tmp_path)
    d.hub_model("o/m")
    refusal(d, "o/down")
    clock.now += 29.9
    d.hub_model("o/m")
    refusal(d, "o/down")
    assert [a[0] for a in hub.asked] == ["o/m", "o/down"]
    clock.now += 0.1  # 30 s: the Hub failure is asked again
    refusal(d, "o/down")
    d.hub_model("o/m")
    assert [a[0] for a in hub.asked] == ["o/m", "o/down", "o/down"]
    clock.now = 1000.0 + 599.9
    d.hub_model("o/m")
    assert len(hub.asked) == 3
    clock.now = 1000.0 + 600  # ten minutes: asked again
    d.hub_model("o/m")
    assert [a[0] for a in hub.asked][3:] == ["o/m"] and hub.asked[3][3] == 10.0  # the Hub's timeout, 10 s


def test_the_verdict_cache_holds_2048_models(tmp_path, monkeypatch):
    hub = FakeHub(monkeypatch)
    ids = [f"o/m{i}" for i in range(2049)]
    for mid in ids:
        hub.models[mid] = info()
    d = Discovery(DiscoveryPolicy("local"), tmp_path)
    for mid in ids[:2048]:
        d.hub_model(mid)
    d.hub_model(ids[0])
    assert len(hub.asked) == 2048  # all remembered
    d.hub_model(ids[2048])  # the 2049th: the least recently asked (m1) goes
    d.hub_model(ids[0])
    assert len(hub.asked) == 2049
    d.hub_model(ids[1])
    assert len(hub.asked) == 2050


def test_progress_is_logged_every_five_seconds_and_the_download_time_said(tmp_path, monkeypatch, caplog):
    clock = Clock(monkeypatch)
    progress = _LoggedProgress.for_model("o/m")
    with caplog.at_level(logging.INFO, logger=discover.__name__):
        bar = progress(total=10_000_000, unit="B")
        clock.now += 4.9
        bar.update(1_000_000)  # too soon
        clock.now += 0.1
        bar.update(1_000_000)  # five seconds after the start
        clock.now += 4.9
        bar.update(1_000_000)  # too soon after the last line
        clock.now += 0.1
        bar.update(1_000_000)
        bar.close()
    assert [r.getMessage() for r in caplog.records] == ["o/m: 2.0 of 10.0 MB downloaded",
                                                        "o/m: 4.0 of 10.0 MB downloaded"]
    caplog.clear()
    hub_with(monkeypatch)
    downloads = FakeDownloads({"config.json": b"{}", "model.safetensors": b"w"})

    def slow():
        clock.now += 1.25

    downloads.during = slow
    with caplog.at_level(logging.INFO, logger=discover.__name__):
        Discovery(DiscoveryPolicy("local"), tmp_path, downloader=downloads).ensure("o/m")
    assert caplog.records[-1].getMessage() == "o/m: downloaded in 2.5s"


def test_a_download_cut_midway_says_how_far_its_weights_got_and_a_watcher_saw_the_bytes_rise(tmp_path, monkeypatch):
    """The bars huggingface_hub's snapshot_download makes: "Downloading bytes" (received), "Reconstructing" (written)."""
    from hugginggpt.modelhost import progress

    hub_with(monkeypatch, siblings={"config.json": 10, "model.safetensors": 5 * 2**20})
    downloads = FakeDownloads({"config.json": b"{}"})

    def cut(**kwargs):
        downloads(**kwargs)
        if kwargs["allow_patterns"] != ["model.safetensors"]:
            small = kwargs["tqdm_class"](desc="Downloading bytes", total=2, unit="B")
            small.update(2)  # the configs: not the weights' progress
            small.close()
            return
        bar = kwargs["tqdm_class"](desc="Downloading bytes", total=4_000_000, unit="B")
        written = kwargs["tqdm_class"](desc="Reconstructing (incomplete total...)", total=4_000_000, unit="B")
        for _ in range(3):
            bar.update(1_000_000)
            written.update(1_000_000)  # the same bytes on disk: counted once
        raise OSError("Connection reset by peer")

    events: list[dict] = []
    watch = progress.Watch(events.append, byte_gap=0)
    d = Discovery(DiscoveryPolicy("local"), tmp_path, downloader=cut)
    with progress.watching(watch), pytest.raises(DiscoveryRefused) as err:
        d.ensure("o/m")
    assert str(err.value) == ("downloading o/m from the Hub failed after 3.0 of 4.0 MB of weights, with model.safetensors "
                              "not downloaded (OSError: Connection reset by peer)")  # the file that was cut
    assert events[0] == {"phase": "downloading"}
    assert [(e["bytes"], e["total_bytes"]) for e in events[1:]] == [
        (1_000_000, 4_000_000), (2_000_000, 4_000_000), (3_000_000, 4_000_000)]
    assert [e["fraction"] for e in events[1:]] == [0.25, 0.5, 0.75]


def test_a_failed_download_names_up_to_three_files_it_left_missing(tmp_path):
    from hugginggpt.modelhost.discover import unfinished

    (tmp_path / "unet").mkdir()
    (tmp_path / "unet" / "config.json").write_text("{}")
    files = ["unet/config.json", "unet/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors",
             "text_encoder/model.safetensors", "tokenizer/vocab.json"]
    assert unfinished(tmp_path, files) == (", with unet/diffusion_pytorch_model.safetensors, "
                                           "vae/diffusion_pytorch_model.safetensors, text_encoder/model.safetensors "
                                           "and 1 more not downloaded")
    assert unfinished(tmp_path, files[:3]) == (", with unet/diffusion_pytorch_model.safetensors, "
                                               "vae/diffusion_pytorch_model.safetensors not downloaded")
    assert unfinished(tmp_path, ["unet/config.json"]) == ""
