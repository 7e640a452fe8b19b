"""Edge cases of hugginggpt/modelhost/download.py, each pinned where a user would notice it broken
(mutation audit: docs/TESTING.md)."""

from __future__ import annotations

import json
import shutil
import types
from pathlib import Path

import pytest

from hugginggpt.modelhost import download
from hugginggpt.modelhost.download import HubSizes, _human, known_size, main

MiB = 1024 * 1024


def test_sizes_read_in_binary_units():
    assert _human(None) == "size unknown"
    assert _human(0) == "0 B"
    assert _human(1023) == "1023 B"
    assert _human(1024) == "1.0 KB"
    assert _human(1536) == "1.5 KB"
    assert _human(MiB - 1) == "1024.0 KB"
    assert _human(MiB) == "1.0 MB"
    assert _human(2.5 * 1024 * MiB) == "2.5 GB"
    assert _human(5 * 1024 * 1024 * MiB) == "5120.0 GB"


class FakeApi:
    """huggingface_hub.HfApi replaced: model_info answers `sizes[id]` as siblings (an exception is raised)."""

    answers: dict = {}
    asked: list = []

    def model_info(self, model_id, files_metadata=False, timeout=None):
        FakeApi.asked.append((model_id, files_metadata, timeout))
        answer = FakeApi.answers[model_id]
        if isinstance(answer, BaseException):
            raise answer
        if answer is None:
            return types.SimpleNamespace(siblings=None)
        return types.SimpleNamespace(siblings=[types.SimpleNamespace(rfilename=f"f{i}", size=s)
                                               for i, s in enumerate(answer)])


@pytest.fixture
def hub(monkeypatch):
    import huggingface_hub

    FakeApi.answers, FakeApi.asked = {}, []
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    return FakeApi


def test_the_hubs_repository_size_is_the_sum_of_its_files(hub):
    hub.answers.update({"o/a": [100, None, 23], "o/empty": [None, 0], "o/none": None})
    sizes = HubSizes()
    assert sizes("o/a") == 123
    assert sizes("o/empty") is None and sizes("o/none") is None
    assert hub.asked[0] == ("o/a", True, 5) and sizes.reachable


def test_after_one_failure_the_hub_is_not_asked_again(hub):
    hub.answers.update({"o/a": ConnectionError("offline"), "o/b": [5]})
    sizes = HubSizes()
    assert sizes("o/a") is None and not sizes.reachable
    assert sizes("o/b") is None and [a[0] for a in hub.asked] == ["o/a"]


def test_a_known_size_prefers_the_hub_then_the_table(hub):
    hub.answers.update({"dslim/bert-base-NER": [7 * MiB], "o/unknown": [3], "hustvl/yolos-tiny": None})
    assert known_size("dslim/bert-base-NER", []) == (433 * MiB, False)  # no Hub to ask: the table
    assert known_size("dslim/bert-base-NER", [], HubSizes()) == (7 * MiB, True)
    assert known_size("hustvl/yolos-tiny", [], HubSizes()) == (26 * MiB, False)  # the Hub had no figure
    assert known_size("o/unknown", [], HubSizes()) == (3, True)
    assert known_size("o/nowhere", []) == (None, False)
    assert known_size("lllyasviel/Annotators", ["ControlNetHED.pth", "facenet.pth"], HubSizes()) == (
        int(183 * MiB), False)  # single files: the table's figures, never the whole repository's
    assert known_size("lllyasviel/Annotators", ["ControlNetHED.pth", "other.pth"]) == (None, False)
    assert known_size("lllyasviel/Annotators", ["mlsd_large_512_fp32.pth"]) == (6 * MiB, False)
    assert hub.asked and all(a[0] != "lllyasviel/Annotators" for a in hub.asked)


# -- the command, on a catalog of its own ---------------------------------------------------------------------------


ROWS = [
    {"id": "t/whole", "task": "text-classification",
     "local": {"loader": "pipeline", "level": "minimal", "pipeline_task": "text-classification"}},
    {"id": "t/ann-a", "task": "hed-control",
     "local": {"loader": "controlnet-aux", "level": "minimal", "weights_from": "t/annotators",
               "files": ["b.pth", "a.pth"]}},
    {"id": "t/ann-b", "task": "mlsd-control",  # one file of the two: the repository's files are the union
     "local": {"loader": "controlnet-aux", "level": "minimal", "weights_from": "t/annotators", "files": ["b.pth"]}},
    {"id": "t/canny", "task": "canny-control", "local": {"loader": "annotator", "level": "minimal",
                                                         "needs_weights": False}},
    {"id": "t/part-then-whole", "task": "x", "local": {"loader": "pipeline", "level": "minimal",
                                                        "weights_from": "t/shared", "files": ["one.bin"]}},
    {"id": "t/shared", "task": "x", "local": {"loader": "pipeline", "level": "minimal"}},
    {"id": "t/whole-then-part", "task": "x", "local": {"loader": "pipeline", "level": "minimal",
                                                        "weights_from": "t/shared", "files": ["two.bin"]}},
    {"id": "t/cn", "task": "canny-control", "local": {"loader": "controlnet", "level": "standard",
                                                      "base_model": "t/sd"}},
    {"id": "t/sd-unet", "task": "x", "local": {"loader": "pipeline", "level": "standard", "weights_from": "t/sd",
                                               "files": ["unet.bin"]}},
    {"id": "t/ranked-only", "task": "x"},
]


@pytest.fixture
def setup(tmp_path, monkeypatch):
    catalog = tmp_path / "catalog.jsonl"
    catalog.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    models = tmp_path / "models"
    config = tmp_path / "c.yaml"
    config.write_text(f"root: {tmp_path}\ncatalog: catalog.jsonl\nlocal_models_dir: models\n"
                      "local_deployment: minimal\n")
    monkeypatch.chdir(tmp_path)
    # a relative folder missing beside root is looked for in the project next: a checkout that has its own
    # models/ (the default download folder) would take this test's downloads
    monkeypatch.setattr("hugginggpt.config.PROJECT_ROOT", tmp_path / "project")
    return types.SimpleNamespace(config=str(config), models=models, catalog=catalog)


class FakeSnapshots:
    """huggingface_hub.snapshot_download replaced: writes each asked file (or `whole`), or fails for `fail`."""

    def __init__(self, monkeypatch):
        import huggingface_hub

        self.calls: list[tuple[str, Path, list | None]] = []
        self.fail: dict[str, BaseException] = {}
        monkeypatch.setattr(huggingface_hub, "snapshot_download", self)

    def __call__(self, repo_id, local_dir, allow_patterns=None):
        self.calls.append((repo_id, Path(local_dir), allow_patterns))
        if repo_id in self.fail:
            raise self.fail[repo_id]
        Path(local_dir).mkdir(parents=True, exist_ok=True)
        for name in allow_patterns or ["model.safetensors"]:
            (Path(local_dir) / name).write_bytes(b"w" * 1536)


def test_the_files_of_each_repository_are_fetched_once_and_only_those_needed(setup, monkeypatch, capsys, hub):
    snaps = FakeSnapshots(monkeypatch)
    assert main(["--config", setup.config]) == 0
    models = setup.models
    assert snaps.calls == [("t/annotators", models / "t/annotators", ["a.pth", "b.pth"]),
                           ("t/shared", models / "t/shared", None),
                           ("t/whole", models / "t/whole", None)]
    out = capsys.readouterr().out.splitlines()
    assert out == [f"t/annotators: fetching a.pth, b.pth of t/annotators into {models / 't/annotators'} ...",
                   "t/annotators: done (3.0 KB)",
                   f"t/shared: fetching t/shared into {models / 't/shared'} ...",
                   "t/shared: done (1.5 KB)",
                   f"t/whole: fetching t/whole into {models / 't/whole'} ...",
                   "t/whole: done (1.5 KB)"]
    assert main(["--config", setup.config]) == 0  # everything is there now
    assert capsys.readouterr().out.splitlines() == [
        f"t/annotators: already in {models / 't/annotators'} (3.0 KB)",
        f"t/shared: already in {models / 't/shared'} (1.5 KB)", f"t/whole: already in {models / 't/whole'} (1.5 KB)"]
    assert len(snaps.calls) == 3


def test_a_partly_fetched_repository_is_fetched_again(setup, monkeypatch, capsys, hub):
    snaps = FakeSnapshots(monkeypatch)
    (setup.models / "t/annotators").mkdir(parents=True)
    (setup.models / "t/annotators/a.pth").write_bytes(b"a")
    (setup.models / "t/shared").mkdir(parents=True)  # empty: not there
    assert main(["--config", setup.config, "--only", "t/ann-a", "t/shared"]) == 0
    assert snaps.calls == [("t/annotators", setup.models / "t/annotators", ["a.pth", "b.pth"]),
                           ("t/shared", setup.models / "t/shared", None)]


def test_a_base_model_comes_with_its_controlnet(setup, monkeypatch, capsys, hub):
    snaps = FakeSnapshots(monkeypatch)
    assert main(["--config", setup.config, "--deployment", "standard", "--only", "t/cn"]) == 0
    assert snaps.calls == [("t/cn", setup.models / "t/cn", None), ("t/sd", setup.models / "t/sd", None)]
    snaps.calls.clear()
    shutil.rmtree(setup.models / "t/sd")
    # a base model is fetched whole, even where another model needs one file of it (listed after it)
    assert main(["--config", setup.config, "--deployment", "standard", "--only", "t/cn", "t/sd-unet"]) == 0
    assert snaps.calls == [("t/sd", setup.models / "t/sd", None)]  # t/cn is there already


def test_failures_are_reported_one_line_each_and_counted(setup, monkeypatch, capsys, hub):
    snaps = FakeSnapshots(monkeypatch)
    snaps.fail = {"t/whole": OSError("no route to host\ntraceback " + "x" * 300),
                  "t/shared": RuntimeError("r" * 250)}
    assert main(["--config", setup.config]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ["t/shared: failed: RuntimeError: " + "r" * 200, "t/whole: failed: OSError: no route to host",
                   "2 of 3 downloads failed: t/shared, t/whole"]
    assert (setup.models / "t/annotators/b.pth").is_file()  # the others were fetched all the same


def test_a_dry_run_says_what_would_be_fetched_and_how_much(setup, monkeypatch, capsys, hub):
    snaps = FakeSnapshots(monkeypatch)
    hub.answers.update({"t/whole": [3 * MiB, MiB], "t/shared": None})
    monkeypatch.setitem(download.KNOWN_FILE_MB, "a.pth", 2)
    monkeypatch.setitem(download.KNOWN_FILE_MB, "b.pth", 0.5)
    monkeypatch.setitem(download.KNOWN_MB, "t/shared", 10)
    assert main(["--config", setup.config, "--dry-run"]) == 0
    models = setup.models
    assert capsys.readouterr().out.splitlines() == [
        f"t/annotators: would fetch a.pth, b.pth into {models / 't/annotators'} (about 2.5 MB)",
        f"t/shared: would fetch into {models / 't/shared'} (about 10.0 MB)",
        f"t/whole: would fetch into {models / 't/whole'} (4.0 MB)",
        "total: 3 download(s), about 16.5 MB"]
    assert snaps.calls == [] and not models.exists()
    monkeypatch.delitem(download.KNOWN_MB, "t/shared")
    hub.answers["t/whole"] = ConnectionError("offline")
    assert main(["--config", setup.config, "--dry-run", "--only", "t/shared", "t/whole"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"t/shared: would fetch into {models / 't/shared'} (size unknown)",
        f"t/whole: would fetch into {models / 't/whole'} (size unknown)",
        "total: 2 download(s), about 0 B (2 size(s) unknown, not counted)"]


def test_a_model_shipped_in_a_package_is_not_fetched(tmp_path, monkeypatch, capsys, hub):
    snaps = FakeSnapshots(monkeypatch)
    from hugginggpt.catalog.semantic import default_model_path

    assert main(["--deployment", "minimal", "--models-dir", str(tmp_path / "m"), "--only",
                 "sentence-transformers/all-MiniLM-L6-v2"]) == 0
    assert capsys.readouterr().out == (f"sentence-transformers/all-MiniLM-L6-v2: ships inside a Python package "
                                       f"({default_model_path()}), nothing to fetch\n")
    assert snaps.calls == []


def test_a_model_shipped_in_a_package_does_not_stop_the_downloads_after_it(setup, monkeypatch, capsys, hub):
    from hugginggpt.catalog.semantic import default_model_path

    if default_model_path() is None:
        pytest.skip("the sentence model's package is not installed")
    packaged = {"id": "sentence-transformers/all-MiniLM-L6-v2", "task": "sentence-similarity",
                "local": {"loader": "sentence-embedding", "level": "minimal"}}
    setup.catalog.write_text("\n".join(json.dumps(r) for r in [packaged, *ROWS]) + "\n")
    snaps = FakeSnapshots(monkeypatch)
    assert main(["--config", setup.config, "--only", packaged["id"], "t/whole"]) == 0  # sorted: the package first
    assert snaps.calls == [("t/whole", setup.models / "t/whole", None)]


def test_defaults_are_the_standard_level_in_models(tmp_path, monkeypatch, capsys, hub):
    monkeypatch.chdir(tmp_path)
    FakeSnapshots(monkeypatch)
    assert main(["--dry-run", "--only", "dslim/bert-base-NER"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith(
        f"dslim/bert-base-NER: would fetch into {Path('models') / 'dslim/bert-base-NER'} (")
    assert main(["--dry-run", "--only", "stable-diffusion-v1-5/stable-diffusion-v1-5"]) == 2  # a full-level model
    assert "is not a model of the standard level" in capsys.readouterr().err


def test_an_unknown_id_is_an_error_with_a_suggestion(setup, monkeypatch, capsys, hub):
    snaps = FakeSnapshots(monkeypatch)
    assert main(["--config", setup.config, "--only", "t/whlle", "t/whole", "zzzzzz", "t/ann-c"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: t/whlle is not a model of the minimal level; did you mean t/whole?",
        "error: zzzzzz is not a model of the minimal level; see --dry-run for the minimal list",
        # as close as each other: both are named, not the first in some order
        "error: t/ann-c is not a model of the minimal level; did you mean t/ann-b or t/ann-a?"]
    assert snaps.calls == []
    assert main(["--config", setup.config, "--only", "t/cn"]) == 2  # a standard-level model
    assert main(["--config", setup.config, "--only", "t/canny"]) == 2  # no weights: nothing to fetch for it


def test_a_bad_config_is_a_usage_error(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("local_deployment: huge\n")
    assert main(["--config", str(config)]) == 2
    assert capsys.readouterr().err.startswith("config error: ")
    with pytest.raises(SystemExit) as exit_:
        main(["--deployment", "huge"])
    assert exit_.value.code == 2


# -- --hub: models outside the catalog --------------------------------------------------------------------------------


class FakeDiscovery:
    """discover.Discovery replaced: records how it was built; `status` / `ensure` answer from `states`."""

    built: list = []

    def __init__(self, policy, models_dir, *, endpoint=None, token=None, curated_ids=()):
        FakeDiscovery.built.append(types.SimpleNamespace(policy=policy, models_dir=models_dir, endpoint=endpoint,
                                                         token=token, curated=frozenset(curated_ids)))
        self.models_dir = models_dir

    def status(self, mid):
        from hugginggpt.modelhost.discover import DiscoveryRefused

        if mid.startswith("bad/"):
            raise DiscoveryRefused("bad model id")
        if mid.startswith("no/"):
            return {"loaded": False, "loadable": False, "discovered": True, "problem": f"{mid} is gated",
                    "kind": "gated"}
        if mid.startswith("here/"):
            return {"loaded": True, "loadable": True, "discovered": True}
        if mid.startswith("unsized/"):
            return {"loaded": False, "loadable": True, "discovered": True, "task": "summarization"}
        return {"loaded": False, "loadable": True, "discovered": True, "task": "token-classification", "size_mb": 0.4}

    def ensure(self, mid):
        from hugginggpt.modelhost.discover import DiscoveryRefused
        from hugginggpt.modelhost.registry import ModelSpec

        if mid.startswith("no/"):
            raise DiscoveryRefused(f"{mid} is gated", 403, "gated")
        folder = self.models_dir / mid
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.safetensors").write_bytes(b"w" * 2048)
        return ModelSpec(mid, "token-classification", "pipeline", "standard")


@pytest.fixture
def discovery(monkeypatch):
    import hugginggpt.modelhost.discover as discover

    FakeDiscovery.built = []
    monkeypatch.setattr(discover, "Discovery", FakeDiscovery)
    return FakeDiscovery


def test_hub_models_are_fetched_and_refusals_counted(tmp_path, monkeypatch, capsys, discovery):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    models = tmp_path / "m"
    assert main(["--models-dir", str(models), "--hub", "o/ner", "no/gated"]) == 1
    out = capsys.readouterr()
    assert out.out == f"o/ner: in {models / 'o/ner'} (token-classification, 2.0 KB)\n"
    assert out.err == "no/gated: refused: no/gated is gated\n1 of 2 refused: no/gated\n"
    built = discovery.built[0]
    assert built.policy.mode == "local" and built.policy.allow == () and built.policy.deny == ()
    assert built.policy.max_size_mb is None and built.endpoint is None and built.token is None
    assert built.models_dir == models and "dslim/bert-base-NER" in built.curated
    assert main(["--models-dir", str(models), "--hub", "o/ner"]) == 0


def test_a_hub_dry_run_says_what_would_be_fetched(tmp_path, monkeypatch, capsys, discovery):
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.test")
    models = tmp_path / "m"
    (models / "here/ner").mkdir(parents=True)
    (models / "here/ner/model.safetensors").write_bytes(b"w" * 3072)
    assert main(["--models-dir", str(models), "--hub", "o/ner", "here/ner", "unsized/sum", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[-3:] == [
        "o/ner: would fetch (token-classification, 0.4 MB of weights)",
        f"here/ner: already in {models / 'here/ner'} (3.0 KB)",
        "unsized/sum: would fetch (summarization, ? MB of weights)"]
    assert discovery.built[0].endpoint == "http://hub.test"
    assert main(["--models-dir", str(models), "--hub", "no/gated", "bad/x", "--dry-run"]) == 1
    assert capsys.readouterr().err.splitlines() == ["no/gated: refused: no/gated is gated",
                                                    "bad/x: refused: bad model id",
                                                    "2 of 2 refused: no/gated, bad/x"]
    assert not (models / "o").exists()


@pytest.mark.parametrize("cap, expected", [("5", 5.0), ("0.5", 0.5), ("0", None), ("-1", None)])
def test_the_configs_author_lists_token_and_size_cap_apply_to_hub_models(tmp_path, monkeypatch, capsys, discovery,
                                                                          cap, expected):
    monkeypatch.setenv("HF_ENDPOINT", "")
    config = tmp_path / "c.yaml"
    config.write_text(f"root: {tmp_path}\nlocal_models_dir: m\ndiscovered_authors_allow: [good]\n"
                      f"discovered_authors_deny: [evil]\nhuggingface: {{token: hf_secret}}\n"
                      f"model_constraints: {{max_size_mb: {cap}}}\n")
    assert main(["--config", str(config), "--hub", "o/ner", "--dry-run"]) == 0
    built = discovery.built[0]
    assert built.policy.allow == ("good",) and built.policy.deny == ("evil",)
    assert built.policy.max_size_mb == expected and isinstance(built.policy.max_size_mb, (float, type(None)))
    assert built.token == "hf_secret" and built.endpoint is None and built.models_dir == tmp_path / "m"


def test_a_size_cap_that_is_not_a_number_is_a_config_error_before_anything_is_fetched(tmp_path, capsys, discovery):
    config = tmp_path / "c.yaml"
    config.write_text(f"root: {tmp_path}\nlocal_models_dir: m\nmodel_constraints: {{max_size_mb: big}}\n")
    assert main(["--config", str(config), "--hub", "o/ner", "--dry-run"]) == 2
    assert capsys.readouterr().err == f"config error: {config}: `model_constraints.max_size_mb` must be a number\n"
    assert discovery.built == []


def test_a_config_with_no_llm_key_is_enough(tmp_path, monkeypatch, capsys, hub):
    """The GPU box's copy of the config need not hold the OpenAI key: the downloader never calls the LLM."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config = tmp_path / "c.yaml"
    config.write_text(f"root: {tmp_path}\nopenai: {{model: gpt-4o-mini}}\nlocal_models_dir: m\n")
    assert main(["--config", str(config), "--dry-run", "--only", "dslim/bert-base-NER"]) == 0
    assert capsys.readouterr().out.startswith(f"dslim/bert-base-NER: would fetch into {tmp_path / 'm'}")


def test_the_help_keeps_the_examples_one_per_line(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "\n    python -m hugginggpt.modelhost.download --only dslim/bert-base-NER\n" in out


def test_the_help_explains_every_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Exits 0 when everything wanted is on disk, 1 when a download failed, 2 for a bad argument." in text
    for phrase in ("--config CONFIG take local_deployment, local_models_dir and the catalog from this config",
                   "--deployment {minimal,standard,full} minimal | standard | full (default: standard)",
                   "--models-dir MODELS_DIR where the weights go (default: models/)",
                   "--only [ONLY ...] download just these ids",
                   "--dry-run list what would be fetched, with sizes, and stop",
                   "--hub ID [ID ...] fetch these Hub models outside the catalog now, with the checks the models "
                   "server makes on first use (generic loader, no remote code, not gated; the config's author lists "
                   "and size cap)"):
        assert phrase in text, phrase


class Terminal:
    """sys.stdout as a pipe sees it: what was written and not yet flushed is `pending`."""

    def __init__(self):
        self.text, self.pending = "", ""

    def write(self, s):
        self.text += s
        self.pending += s
        return len(s)

    def flush(self):
        self.pending = ""


def test_each_line_is_out_before_the_long_wait_that_follows_it(setup, monkeypatch, hub, discovery):
    term = Terminal()
    monkeypatch.setattr("sys.stdout", term)
    snaps = FakeSnapshots(monkeypatch)
    seen = []
    real = snaps.__call__
    monkeypatch.setattr(download, "_size", lambda path: seen.append(term.pending) or 0)
    assert main(["--config", setup.config, "--dry-run"]) == 0
    assert seen == []
    asked = []
    hub.answers = {k: [1] for k in ("t/annotators", "t/shared", "t/whole")}
    real_info = hub.model_info

    def model_info(self, model_id, **kwargs):
        asked.append(term.pending)
        return real_info(self, model_id, **kwargs)

    monkeypatch.setattr(hub, "model_info", model_info)
    assert main(["--config", setup.config, "--dry-run"]) == 0
    assert asked == ["", ""] and term.pending.startswith("total: ")  # t/annotators: single files, not asked
    term.flush()
    calls = []

    def snapshot(repo_id, local_dir, allow_patterns=None):
        calls.append(term.pending)
        real(repo_id, local_dir, allow_patterns)

    monkeypatch.setattr(snaps, "__call__", snapshot)
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    assert main(["--config", setup.config]) == 0
    assert calls == ["", "", ""] and term.pending == ""
    assert main(["--models-dir", str(setup.models), "--hub", "o/a", "o/b"]) == 0
    assert term.pending == "" and "o/b: in " in term.text
