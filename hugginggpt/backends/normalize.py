"""Raw model answers -> JARVIS's result keys; boxes drawn onto a copy of the input image."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..resources import decode_image, save_image
from . import TaskInputs

FILE_KEYS = ("generated image", "generated audio", "generated video")
PATH_KEY_BY_TASK = {
    "text-to-video": "generated video",
    "text-to-speech": "generated audio",
    "audio-to-audio": "generated audio",
}
# The colours of a drawing's labels, one per label in turn: any distinct colours will do (these are the ones
# random.Random(0) gave the first twelve labels before).
BOX_COLORS = ((197, 97, 215), (20, 33, 248), (207, 100, 155), (244, 45, 111), (71, 36, 71), (48, 79, 128),
              (75, 39, 50), (37, 87, 169), (241, 71, 51), (181, 55, 161), (104, 70, 244), (226, 66, 133))


def path_key(task: str) -> str:
    return PATH_KEY_BY_TASK.get(task, "generated image")


def normalize(task: str, raw: Any, inputs: TaskInputs, public_dir: Path) -> dict[str, Any]:
    """Map a models-server answer onto the keys the response stage and `<GENERATED>` refs expect."""
    if isinstance(raw, dict) and "error" in raw:
        err = raw["error"]
        return {"error": err if isinstance(err, dict) else {"message": str(err)}}
    if task == "object-detection" and isinstance(raw, list):
        return {"generated image": draw_boxes(inputs, raw, public_dir), "predicted": raw}
    if isinstance(raw, dict):
        result = dict(raw)
        if "path" in result:
            result[path_key(task)] = result.pop("path")
        if task == "audio-to-audio" and isinstance(result.get("paths"), list):
            result["generated audio"] = result.pop("paths")[0]
        return result
    if isinstance(raw, list) and task == "audio-to-audio" and raw and isinstance(raw[0], dict) and "path" in raw[0]:
        return {"generated audio": raw[0]["path"], "predicted": raw}
    return {"predicted": raw}


def draw_boxes(inputs: TaskInputs, predicted: list[dict[str, Any]], public_dir: Path) -> str | None:
    if inputs.image is None:
        return None
    from PIL import ImageDraw

    image = decode_image(inputs.image.data, what="the input image")
    draw = ImageDraw.Draw(image)
    colors: dict[str, tuple[int, int, int]] = {}
    for item in predicted:
        box = item.get("box") if isinstance(item, dict) else None
        if not box:
            continue
        label = str(item.get("label", ""))
        color = colors.setdefault(label, BOX_COLORS[len(colors) % len(BOX_COLORS)])
        draw.rectangle(((box["xmin"], box["ymin"]), (box["xmax"], box["ymax"])), outline=color, width=2)
        draw.text((box["xmin"] + 3, max(0, box["ymin"] - 12)), label, fill=color)
    return save_image(public_dir, image)


def overlay_masks(base: Any, masks: list[Any]) -> Any:
    """A copy of `base` with each segmentation mask tinted in its own colour, half transparent."""
    from PIL import Image

    overlay = base.copy()
    for n, mask in enumerate(masks):
        color = ((n * 97 + 30) % 256, (n * 57 + 80) % 256, (n * 151 + 40) % 256)
        tint = Image.blend(overlay, Image.new("RGB", base.size, color), 0.5)
        overlay = Image.composite(tint, overlay, mask.convert("L").resize(base.size))
    return overlay
