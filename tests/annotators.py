"""controlnet_aux's own HED, MLSD and OpenPose code, runnable where its package `__init__` is not (test only).

The package's `__init__` imports every detector it has, and so torchvision, which has no CPU build on this
machine's registries. The three detectors we serve need only torch, OpenCV and NumPy, plus two
`torchvision.transforms` helpers that OpenPose's face module imports. `standin(folder)` writes a folder to put
first on PYTHONPATH: a `controlnet_aux/__init__.py` that extends the package path to the installed package's
folder and imports just those three modules (the two helpers stood in for while face.py imports), so the
production loader's plain `import controlnet_aux; controlnet_aux.HEDdetector...` runs the library's real code.

`build_checkpoints(models_dir, path)` saves random checkpoints for the library's own network classes, a few
kilobytes each: every tensor is a strided view of one small random storage (torch.save keeps views as views),
which `load_state_dict` copies into the full-size modules as usual.
"""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

FILES = ("ControlNetHED.pth", "mlsd_large_512_fp32.pth", "body_pose_model.pth", "hand_pose_model.pth",
         "facenet.pth")

_INIT = '''"""Test stand-in for controlnet_aux/__init__.py: only HED, MLSD and OpenPose, from {real!r}."""
import sys
import types

__path__.append({real!r})


def _transforms():
    import numpy as np
    import torch
    from PIL import Image

    class ToTensor:  # PIL image or HWC uint8 array -> CHW float tensor in [0, 1]
        def __call__(self, pic):
            arr = np.asarray(pic)
            arr = arr[:, :, None] if arr.ndim == 2 else arr
            return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1))).float().div(255)

    class ToPILImage:  # CHW float tensor in [0, 1] -> PIL image
        def __call__(self, pic):
            arr = (pic.detach().cpu().numpy() * 255).clip(0, 255).astype(np.uint8).transpose(1, 2, 0)
            return Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr)

    module = types.ModuleType("torchvision.transforms")
    module.ToTensor, module.ToPILImage = ToTensor, ToPILImage
    return module


_saved = {{name: sys.modules.get(name) for name in ("torchvision", "torchvision.transforms")}}
sys.modules["torchvision"] = types.ModuleType("torchvision")
sys.modules["torchvision.transforms"] = _transforms()
try:
    from .hed import HEDdetector  # noqa: E402
    from .mlsd import MLSDdetector  # noqa: E402
    from .open_pose import OpenposeDetector  # noqa: E402
finally:  # nothing else in the process sees a torchvision
    for _name, _module in _saved.items():
        if _module is None:
            sys.modules.pop(_name, None)
        else:
            sys.modules[_name] = _module
'''

_BUILD = '''
import sys
from pathlib import Path

import torch

import controlnet_aux
from controlnet_aux.hed import ControlNetHED_Apache2
from controlnet_aux.mlsd.models.mbv2_mlsd_large import MobileV2_MLSD_Large
from controlnet_aux.open_pose.face import FaceNet
from controlnet_aux.open_pose.model import bodypose_model, handpose_model

assert controlnet_aux.HEDdetector and controlnet_aux.OpenposeDetector  # the stand-in __init__ ran
torch.manual_seed(0)
pool = torch.randn(4096) * 0.05  # one small storage; every tensor a view of it


def tiny(state, drop_prefix=False):
    out = {}
    for key, t in state.items():
        if drop_prefix:  # body and hand checkpoints name keys without the first segment (open_pose.util.transfer)
            key = key.split(".", 1)[1]
        view = pool.as_strided(tuple(t.shape), (1,) * t.dim()) if t.dim() else pool[0].clone()
        if key.endswith("running_var"):  # a variance is positive
            view = view.abs() + 0.5
        out[key] = view.to(t.dtype)
    return out


folder = Path(sys.argv[1])
folder.mkdir(parents=True, exist_ok=True)
torch.save(tiny(ControlNetHED_Apache2().state_dict()), folder / "ControlNetHED.pth")
torch.save(tiny(MobileV2_MLSD_Large().state_dict()), folder / "mlsd_large_512_fp32.pth")
torch.save(tiny(bodypose_model().state_dict(), drop_prefix=True), folder / "body_pose_model.pth")
torch.save(tiny(handpose_model().state_dict(), drop_prefix=True), folder / "hand_pose_model.pth")
torch.save(tiny(FaceNet().state_dict()), folder / "facenet.pth")
'''


def installed_package() -> Path | None:
    """The installed controlnet_aux folder (found without importing it), or None."""
    spec = importlib.machinery.PathFinder.find_spec("controlnet_aux")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def standin(folder: Path) -> Path | None:
    """A folder to put first on PYTHONPATH (see the module docstring), or None when controlnet_aux is absent."""
    real = installed_package()
    if real is None:
        return None
    package = folder / "controlnet_aux"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(_INIT.format(real=str(real)))
    return folder


def env_with(path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), env.get("PYTHONPATH")) if p)
    return env


def build_checkpoints(models_dir: Path, path: Path) -> Path:
    """lllyasviel/Annotators under models_dir with random checkpoints of the right shapes; returns the folder."""
    folder = models_dir / "lllyasviel" / "Annotators"
    if not all((folder / f).is_file() for f in FILES):
        proc = subprocess.run([sys.executable, "-c", _BUILD, str(folder)], env=env_with(path), capture_output=True,
                              text=True, timeout=300)
        if proc.returncode:
            raise RuntimeError(f"building the annotator checkpoints failed:\n{proc.stderr[-3000:]}")
    return folder
