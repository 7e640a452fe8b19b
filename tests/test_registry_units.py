"""Edge cases of hugginggpt/modelhost/registry.py, each pinned where a user or operator would notice it broken
(mutation audit: docs/TESTING.md).

Covered, in-process and on real files: `half_precision_bytes` (the memory a weights file takes in half precision,
read from a .safetensors header written by the `safetensors` library, or the size on disk when the header does not
read), `load_specs` (the catalog's `local` rows mapped field by field, and the line an operator is pointed to when a
row is broken) and `Registry.problem` / `servable` (the exact reason a model cannot be served, as the server shows
it, for missing weights, a missing base model and a library that does not import).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hugginggpt.modelhost.registry import (
    _FLOATS,
    GPU_SHARE,
    LIBRARIES,
    ModelSpec,
    Registry,
    half_precision_bytes,
    load_specs,
)

DOWNLOAD = "run `python -m hugginggpt.modelhost.download --deployment standard`"


# --- half_precision_bytes -------------------------------------------------------------------------------------


def _saved(tmp_path: Path, tensors: dict[str, torch.Tensor], name: str = "model.safetensors",
           metadata: dict[str, str] | None = None) -> Path:
    file = tmp_path / name
    save_file(tensors, str(file), metadata=metadata)
    return file


def _raw(tmp_path: Path, header: bytes, data: bytes = b"", length: int | None = None) -> Path:
    """A .safetensors file written byte by byte: 8-byte little-endian header length, header, data."""
    file = tmp_path / "raw.safetensors"
    file.write_bytes((len(header) if length is None else length).to_bytes(8, "little") + header + data)
    return file


def test_the_floating_point_types_are_the_four_that_half_precision_loading_converts():
    assert _FLOATS == {"F64", "F32", "F16", "BF16"}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_a_floating_point_tensor_counts_two_bytes_a_number(tmp_path, dtype):
    file = _saved(tmp_path, {"w": torch.zeros((3, 4), dtype=dtype)})
    assert half_precision_bytes(file) == 2 * 12
    assert file.stat().st_size > 24  # not the size on disk


@pytest.mark.parametrize(("dtype", "width"), [(torch.int64, 8), (torch.int32, 4), (torch.int16, 2),
                                              (torch.uint8, 1), (torch.int8, 1), (torch.bool, 1)])
def test_a_tensor_of_another_type_counts_its_stored_bytes(tmp_path, dtype, width):
    file = _saved(tmp_path, {"ids": torch.zeros((5, 3), dtype=dtype)})
    assert half_precision_bytes(file) == width * 15


def test_a_scalar_tensor_counts_one_number(tmp_path):
    assert half_precision_bytes(_saved(tmp_path, {"scale": torch.tensor(1.5, dtype=torch.float32)})) == 2
    assert half_precision_bytes(_saved(tmp_path, {"step": torch.tensor(7, dtype=torch.int64)})) == 8


def test_mixed_tensors_sum(tmp_path):
    file = _saved(tmp_path, {
        "weight": torch.zeros((3, 4), dtype=torch.float32),  # 12 numbers -> 24
        "bias": torch.zeros((2, 5, 3), dtype=torch.float64),  # 30 numbers -> 60
        "position_ids": torch.zeros((1, 7), dtype=torch.int64),  # stored: 56
        "mask": torch.zeros(9, dtype=torch.bool),  # stored: 9
    })
    assert half_precision_bytes(file) == 24 + 60 + 56 + 9


def test_the_metadata_entry_is_skipped(tmp_path):
    file = _saved(tmp_path, {"w": torch.zeros((3, 4), dtype=torch.float32)},
                  metadata={"format": "pt", "note": "not a tensor"})
    assert half_precision_bytes(file) == 24


def test_a_file_of_metadata_only_counts_nothing(tmp_path):
    # The header fills the file exactly (length == size - 8): it still reads.
    file = _saved(tmp_path, {}, metadata={"format": "pt"})
    assert int.from_bytes(file.read_bytes()[:8], "little") == file.stat().st_size - 8
    assert half_precision_bytes(file) == 0


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.ckpt", "model.safetensors.index.json",
                                  "model.safetensors.part", "model"])
def test_a_file_of_another_format_counts_its_size_on_disk(tmp_path, name):
    file = tmp_path / name
    save_file({"w": torch.zeros((3, 4), dtype=torch.float32)}, str(file))  # safetensors bytes, another name
    assert file.stat().st_size > 24
    assert half_precision_bytes(file) == file.stat().st_size


def test_a_header_that_reads_counts_its_tensors_even_written_by_hand(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]},
                         "i": {"dtype": "I64", "shape": [2], "data_offsets": [48, 64]}}).encode()
    assert half_precision_bytes(_raw(tmp_path, header, bytes(64))) == 24 + 16


@pytest.mark.parametrize(("header", "data", "length"), [
    (b"", b"", 0),  # an 8-byte file whose header length is 0
    (b"{}", bytes(40), 0),  # a header length of 0 before other bytes
    (b"{}", b"", 3),  # a header length one more than the file holds
    (b"{}", b"", 2 ** 40),  # a header length far larger than the file
    (b"not json", b"", None),
    (b"[1, 2]", b"", None),  # JSON, not an object
    (b'{"w": 5}', b"", None),  # a tensor entry that is not an object
    (b'{"w": {"dtype": "F32", "shape": [3, 4]}}', b"", None),  # no data_offsets
    (b'{"w": {"dtype": "F32", "data_offsets": [0, 48]}}', b"", None),  # no shape
    (b'{"w": {"shape": [3, 4], "data_offsets": [0, 48]}}', b"", None),  # no dtype
    (b'{"w": {"dtype": "F32", "shape": ["x"], "data_offsets": [0, 48]}}', b"", None),  # a shape that is no number
    (b'{"w": {"dtype": "F32", "shape": [3], "data_offsets": [0]}}', b"", None),  # data_offsets not a pair
    (b'{"w": {"dtype": "I64", "shape": [3], "data_offsets": [0, null]}}', b"", None),  # an offset that is no number
])
def test_a_header_that_does_not_read_counts_the_size_on_disk(tmp_path, header, data, length):
    file = _raw(tmp_path, header, data, length)
    assert half_precision_bytes(file) == file.stat().st_size


def test_a_file_shorter_than_the_length_field_counts_its_size_on_disk(tmp_path):
    file = tmp_path / "short.safetensors"
    file.write_bytes(b"\x02\x00")
    assert half_precision_bytes(file) == 2


# --- load_specs -------------------------------------------------------------------------------------------------


def _catalog(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "catalog.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _row(model_id: str, task: str = "text-classification", local: object = None, **more: object) -> str:
    row: dict[str, object] = {"id": model_id, "task": task, "downloads": 3, **more}
    if local is not None:
        row["local"] = local
    return json.dumps(row)


def test_the_gpu_shares_by_loader():
    assert GPU_SHARE == {"diffusers": 0.5, "controlnet": 0.5, "annotator": 0.0}


def test_load_specs_maps_every_field_and_skips_blank_lines_and_rows_without_local(tmp_path):
    path = _catalog(tmp_path, [
        _row("hub/only"),  # no `local`: ranking only
        "",
        "   ",
        _row("org/clf", local={"loader": "pipeline", "level": "minimal", "pipeline_task": "text-classification"}),
        _row("org/empty", local={}),  # an empty `local` is no local model
        json.dumps({"id": "org/null", "task": "fill-mask", "local": None}),
        _row("org/sd", task="text-to-image", local={"loader": "diffusers", "level": "full"}),
        _row("org/cn", task="canny-control", local={
            "loader": "controlnet", "level": "full", "base_model": "org/sd", "gpu": 0.75}),
        _row("org/canny", task="canny-control", local={
            "loader": "annotator", "level": "minimal", "needs_weights": False}),
        _row("org/hed", task="hed-control", local={
            "loader": "annotator", "level": "standard", "weights_from": "lllyasviel/Annotators",
            "files": ["ControlNetHED.pth", "other.pth"], "needs_weights": True, "gpu": "0.125"}),
        _row("org/s2s", task="summarization", local={"loader": "seq2seq", "level": "standard", "gpu": 0}),
    ])
    specs = load_specs(path)
    assert specs == (
        ModelSpec(id="org/clf", task="text-classification", loader="pipeline", level="minimal",
                  pipeline_task="text-classification", base_model=None, weights_from=None, files=(),
                  needs_weights=True, gpu_fraction=0.25, source="curated"),
        ModelSpec(id="org/sd", task="text-to-image", loader="diffusers", level="full", gpu_fraction=0.5),
        ModelSpec(id="org/cn", task="canny-control", loader="controlnet", level="full", base_model="org/sd",
                  gpu_fraction=0.75),
        ModelSpec(id="org/canny", task="canny-control", loader="annotator", level="minimal", needs_weights=False,
                  gpu_fraction=0.0),
        ModelSpec(id="org/hed", task="hed-control", loader="annotator", level="standard",
                  weights_from="lllyasviel/Annotators", files=("ControlNetHED.pth", "other.pth"),
                  needs_weights=True, gpu_fraction=0.125),
        ModelSpec(id="org/s2s", task="summarization", loader="seq2seq", level="standard", gpu_fraction=0.0),
    )
    assert isinstance(specs[4].files, tuple)
    assert all(type(s.needs_weights) is bool and type(s.gpu_fraction) is float for s in specs)


def test_a_falsy_needs_weights_reads_as_false(tmp_path):
    path = _catalog(tmp_path, [_row("org/a", local={"loader": "annotator", "level": "minimal", "needs_weights": 0})])
    assert load_specs(path)[0].needs_weights is False


def test_an_empty_catalog_has_no_specs(tmp_path):
    assert load_specs(_catalog(tmp_path, ["", _row("hub/only")])) == ()


@pytest.mark.parametrize(("local", "missing"), [
    ({"level": "minimal", "pipeline_task": "fill-mask"}, "'loader'"),
    ({"loader": "pipeline"}, "'level'"),
])
def test_a_local_object_without_a_required_field_names_the_line_and_the_field(tmp_path, local, missing):
    path = _catalog(tmp_path, [
        _row("org/fine", local={"loader": "pipeline", "level": "minimal"}),
        "",  # blank lines count in the line numbers
        _row("hub/only"),
        _row("org/broken", local=local),
    ])
    with pytest.raises(ValueError) as caught:
        load_specs(path)
    assert str(caught.value) == f"{path}:4: the `local` object of org/broken lacks {missing}"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_broken_first_line_is_line_1(tmp_path):
    path = _catalog(tmp_path, [_row("org/broken", local={"level": "minimal"})])
    with pytest.raises(ValueError, match=r"^.*catalog\.jsonl:1: the `local` object of org/broken lacks 'loader'$"):
        load_specs(path)


def test_a_row_without_id_or_task_is_named_too(tmp_path):
    path = _catalog(tmp_path, [json.dumps({"task": "fill-mask", "local": {"loader": "pipeline", "level": "minimal"}})])
    with pytest.raises(ValueError) as caught:
        load_specs(path)
    assert str(caught.value) == f"{path}:1: the `local` object of None lacks 'id'"
    path = _catalog(tmp_path, [json.dumps({"id": "org/x", "local": {"loader": "pipeline", "level": "minimal"}})])
    with pytest.raises(ValueError) as caught:
        load_specs(path)
    assert str(caught.value) == f"{path}:1: the `local` object of org/x lacks 'task'"


def test_the_shipped_catalog_loads():
    specs = load_specs()
    ids = [s.id for s in specs]
    assert "stable-diffusion-v1-5/stable-diffusion-v1-5" in ids
    assert len(ids) == len(set(ids))
    sd = specs[ids.index("stable-diffusion-v1-5/stable-diffusion-v1-5")]
    assert (sd.task, sd.loader, sd.level, sd.gpu_fraction) == ("text-to-image", "diffusers", "full", 0.5)


# --- Registry.problem / servable --------------------------------------------------------------------------------

WHOLE = ModelSpec(id="org/whole", task="text-classification", loader="pipeline", level="minimal",
                  pipeline_task="text-classification")
SOME = ModelSpec(id="org/some", task="hed-control", loader="annotator", level="minimal",
                 files=("ControlNetHED.pth", "config.json"))
BORROWS = ModelSpec(id="org/borrows", task="hed-control", loader="annotator", level="minimal",
                    weights_from="lllyasviel/Annotators", files=("ControlNetHED.pth",))
BORROWS_ALL = ModelSpec(id="org/borrows-all", task="depth", loader="annotator", level="minimal",
                        weights_from="org/whole")
NONE_NEEDED = ModelSpec(id="org/canny", task="canny-control", loader="annotator", level="minimal",
                        needs_weights=False, gpu_fraction=0.0)
PLUGS = ModelSpec(id="org/cn", task="canny-control", loader="controlnet", level="standard", base_model="org/sd")
SPECS = (WHOLE, SOME, BORROWS, BORROWS_ALL, NONE_NEEDED, PLUGS)


def _file(path: Path, data: bytes = b"x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@pytest.fixture
def registry(tmp_path) -> Registry:
    (tmp_path / "models").mkdir()
    return Registry("standard", tmp_path / "models", SPECS)


def _check(registry: Registry, spec: ModelSpec, expected: str | None) -> None:
    assert registry.problem(spec) == expected
    assert registry.servable(spec) is (expected is None)


def test_whole_repository_weights_missing_then_present(registry):
    missing = f"weights for org/whole are not in local_models_dir/org/whole; {DOWNLOAD}"
    _check(registry, WHOLE, missing)
    (registry.models_dir / "org" / "whole").mkdir(parents=True)  # an empty folder holds no weights
    _check(registry, WHOLE, missing)
    _file(registry.models_dir / "org" / "whole" / "model.safetensors")
    _check(registry, WHOLE, None)


def test_listed_files_are_named_and_all_needed(registry):
    missing = f"ControlNetHED.pth, config.json for org/some are not in local_models_dir/org/some; {DOWNLOAD}"
    _check(registry, SOME, missing)
    folder = registry.models_dir / "org" / "some"
    _file(folder / "ControlNetHED.pth")
    _file(folder / "unrelated.bin")
    _check(registry, SOME, missing)
    (folder / "config.json").mkdir()  # a folder of that name is not the file
    _check(registry, SOME, missing)
    (folder / "config.json").rmdir()
    _file(folder / "config.json", b"{}")
    _check(registry, SOME, None)


def test_a_model_reading_another_folder_is_told_that_folder(registry):
    missing = f"ControlNetHED.pth for org/borrows are not in local_models_dir/lllyasviel/Annotators; {DOWNLOAD}"
    _check(registry, BORROWS, missing)
    _file(registry.models_dir / "org" / "borrows" / "ControlNetHED.pth")  # its own folder does not count
    _check(registry, BORROWS, missing)
    _file(registry.models_dir / "lllyasviel" / "Annotators" / "ControlNetHED.pth")
    _check(registry, BORROWS, None)


def test_a_model_reading_all_of_another_folder(registry):
    _check(registry, BORROWS_ALL,
           f"weights for org/borrows-all are not in local_models_dir/org/whole; {DOWNLOAD}")
    _file(registry.models_dir / "org" / "borrows-all" / "model.bin")
    _check(registry, BORROWS_ALL, f"weights for org/borrows-all are not in local_models_dir/org/whole; {DOWNLOAD}")
    _file(registry.models_dir / "org" / "whole" / "model.bin")
    _check(registry, BORROWS_ALL, None)


def test_a_model_without_weights_is_servable_on_an_empty_folder(registry):
    _check(registry, NONE_NEEDED, None)


def test_the_hint_names_the_deployment(tmp_path):
    for deployment in ("minimal", "full"):
        registry = Registry(deployment, tmp_path, SPECS)
        assert registry.problem(WHOLE) == (
            "weights for org/whole are not in local_models_dir/org/whole; "
            f"run `python -m hugginggpt.modelhost.download --deployment {deployment}`")


def test_a_missing_base_model_is_named_after_the_weights(registry):
    # Both missing: the weights are told first.
    _check(registry, PLUGS, f"weights for org/cn are not in local_models_dir/org/cn; {DOWNLOAD}")
    _file(registry.models_dir / "org" / "cn" / "diffusion_pytorch_model.safetensors")
    base_missing = "org/cn plugs into org/sd, which is not in local_models_dir/org/sd"
    _check(registry, PLUGS, base_missing)
    _file(registry.models_dir / "org" / "sd")  # a file of that name is not the folder
    _check(registry, PLUGS, base_missing)
    (registry.models_dir / "org" / "sd").unlink()
    (registry.models_dir / "org" / "sd").mkdir()
    _check(registry, PLUGS, None)


def test_a_base_model_is_checked_even_without_weights(tmp_path):
    spec = ModelSpec(id="org/lora", task="text-to-image", loader="controlnet", level="full", base_model="org/sd",
                     needs_weights=False)
    registry = Registry("full", tmp_path, (spec,))
    _check(registry, spec, "org/lora plugs into org/sd, which is not in local_models_dir/org/sd")
    (tmp_path / "org" / "sd").mkdir(parents=True)
    _check(registry, spec, None)


def test_the_registry_keeps_the_specs_of_its_level(tmp_path):
    minimal = Registry("minimal", tmp_path, SPECS)
    assert minimal.deployment == "minimal" and minimal.models_dir == tmp_path
    assert list(minimal.specs) == ["org/whole", "org/some", "org/borrows", "org/borrows-all", "org/canny"]
    assert minimal.get("org/cn") is None and minimal.get("org/whole") is WHOLE
    assert minimal.catalog_ids == frozenset(s.id for s in SPECS)
    assert list(Registry("full", tmp_path, SPECS).specs) == [s.id for s in SPECS]


def _import_failure(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - as the registry reads it
        return f"{exc.__class__.__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    return None


def test_a_loader_whose_library_does_not_import_says_how_to_install_it(registry):
    module, hint = LIBRARIES["controlnet-aux"]
    assert (module, hint) == ("controlnet_aux", "pip install controlnet-aux (it needs torchvision and opencv)")
    why = _import_failure(module)
    if why is None:
        pytest.skip("controlnet_aux imports in this environment")
    spec = ModelSpec(id="org/aux", task="hed-control", loader="controlnet-aux", level="minimal")
    expected = (f"org/aux needs the controlnet_aux library, which does not import here ({why}); "
                "pip install controlnet-aux (it needs torchvision and opencv)")
    _check(registry, spec, expected)  # told before the missing weights
    _file(registry.models_dir / "org" / "aux" / "model.pth")
    _check(registry, spec, expected)
