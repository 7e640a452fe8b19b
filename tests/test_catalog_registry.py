"""One source of truth: the catalog file carries both the ranking facts and how the models server loads a model."""

from __future__ import annotations

import json
import subprocess
import sys

from hugginggpt.catalog import Catalog
from hugginggpt.modelhost.handlers import HANDLERS
from hugginggpt.modelhost.registry import DEFAULT_CATALOG, Registry, load_specs
from tests.conftest import ROOT


def rows() -> list[dict]:
    return [json.loads(line) for line in DEFAULT_CATALOG.read_text().splitlines() if line.strip()]


def test_the_catalog_file_is_what_the_builder_writes(tmp_path):
    check = subprocess.run([sys.executable, str(ROOT / "tools" / "build_catalog.py"), "--check"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    # --help has no side effects
    before = DEFAULT_CATALOG.read_bytes()
    helped = subprocess.run([sys.executable, str(ROOT / "tools" / "build_catalog.py"), "--help"],
                            capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "--check" in helped.stdout and DEFAULT_CATALOG.read_bytes() == before
    # a hand edit is caught
    edited = tmp_path / "p0.jsonl"
    edited.write_text(DEFAULT_CATALOG.read_text().replace('"level": "standard"', '"level": "full"', 1))
    stale = subprocess.run([sys.executable, str(ROOT / "tools" / "build_catalog.py"), "--check", "--out", str(edited)],
                           capture_output=True, text=True, timeout=60)
    assert stale.returncode == 1 and "out of date" in stale.stderr


def test_model_ids_are_unique():
    ids = [r["id"] for r in rows()]
    assert len(ids) == len(set(ids))


def test_the_registry_is_the_catalog_rows_with_local_facts(tmp_path):
    specs = load_specs()
    local_rows = {r["id"]: r for r in rows() if "local" in r}
    assert {s.id for s in specs} == set(local_rows)
    for spec in specs:
        assert spec.task == local_rows[spec.id]["task"]
        assert spec.task in HANDLERS, f"{spec.id}: no handler for {spec.task}"
    catalog = Catalog.load(DEFAULT_CATALOG)
    assert all(catalog.get(s.id) is not None for s in specs)  # every servable model can be selected
    # levels nest: minimal within standard within full
    levels = [set(Registry(level, tmp_path).specs) for level in ("minimal", "standard", "full")]
    assert levels[0] < levels[1] < levels[2]
    assert "canny-control" in levels[0] and "lllyasviel/sd-controlnet-canny" in levels[2] - levels[1]
    # another catalog file gives another registry: nothing is hard-coded beside the data
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"id": "me/tiny", "task": "text-classification",
                               "local": {"loader": "pipeline", "level": "minimal",
                                         "pipeline_task": "text-classification"}}) + "\n")
    assert list(Registry("minimal", tmp_path, catalog_path=one).specs) == ["me/tiny"]


def test_every_task_type_the_models_server_serves_has_a_tiny_model_in_the_tests():
    """Each task type runs through HTTP in tests/test_models_server.py on one of these tiny models."""
    from tests.tiny_models import BUILDERS, FULL_BUILDERS

    specs = {s.id: s for s in load_specs()}
    built = set(BUILDERS) | set(FULL_BUILDERS) | {"sentence-transformers/all-MiniLM-L6-v2"}  # MiniLM is real
    covered = ({specs[m].task for m in built if m in specs} | {s.task for s in specs.values() if not s.needs_weights}
               | {s.task for s in specs.values() if s.weights_from in built})  # annotators on a built model
    untested = {s.task for s in specs.values()} - covered
    # the six other ControlNet kinds share the canny ControlNet's loader and handler; the controlnet_aux
    # annotators cannot import here (torchvision has no CPU build), their refusal is tested instead
    assert untested == ({f"{c}-text-to-image" for c in ("depth", "hed", "mlsd", "normal", "openpose", "seg")}
                        | {f"{c}-control" for c in ("hed", "mlsd", "openpose")})
    bases = {s.base_model for s in specs.values() if s.base_model}  # vocoders and SD bases load beside others
    bases |= {s.weights_from for s in specs.values() if s.weights_from}
    assert all(m in specs or m in bases for m in built), sorted(m for m in built if m not in set(specs) | bases)
