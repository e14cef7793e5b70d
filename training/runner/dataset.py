"""A small synthetic detection dataset, so a CPU can train for real without any download.

Each image is a noisy colour gradient with one to three filled shapes; the class is the
shape: 0 rectangle, 1 circle (an ellipse), 2 triangle. Labels are YOLO txt
(``class cx cy w h``, normalised). The same seed gives the same bytes.
numpy and Pillow come with Ultralytics; they are imported only when a dataset is made.
"""

from __future__ import annotations

from pathlib import Path

CLASS_NAMES = ("rectangle", "circle", "triangle")


def make_demo_dataset(
    root: Path,
    *,
    train_images: int = 64,
    val_images: int = 16,
    imgsz: int = 128,
    seed: int = 0,
) -> Path:
    """Write ``root/images/{train,val}``, ``root/labels/{train,val}`` and ``root/data.yaml``.

    Returns the data YAML's path (its ``path:`` is absolute, as Ultralytics needs).
    Existing images of the same names are overwritten; nothing else under ``root`` is touched.
    """
    import numpy as np

    if train_images < 1 or val_images < 1:
        raise ValueError("train_images and val_images must be >= 1")
    if imgsz < 32:
        raise ValueError("imgsz must be >= 32")
    root = Path(root).resolve()
    rng = np.random.default_rng(seed)
    for split, count in (("train", train_images), ("val", val_images)):
        images, labels = root / "images" / split, root / "labels" / split
        images.mkdir(parents=True, exist_ok=True)
        labels.mkdir(parents=True, exist_ok=True)
        for index in range(count):
            image, lines = _draw(rng, imgsz)
            image.save(images / f"{split}_{index:05d}.png", optimize=False)
            (labels / f"{split}_{index:05d}.txt").write_text("\n".join(lines) + "\n")
    names = "\n".join(f"  {index}: {name}" for index, name in enumerate(CLASS_NAMES))
    data_yaml = root / "data.yaml"
    data_yaml.write_text(
        "# Synthetic shapes (training/runner/dataset.py), made with "
        f"seed={seed}, imgsz={imgsz}\n"
        f"path: {root}\n"
        "train: images/train\n"
        "val: images/val\n"
        f"names:\n{names}\n",
        encoding="utf-8",
    )
    return data_yaml


def _draw(rng, size: int):
    import numpy as np
    from PIL import Image, ImageDraw

    # Background: a random two-colour gradient plus Gaussian noise.
    start, end = rng.integers(0, 120, size=3), rng.integers(0, 120, size=3)
    ramp = np.linspace(0.0, 1.0, size)[:, None, None]
    gradient = start[None, None, :] * (1 - ramp) + end[None, None, :] * ramp
    pixels = np.broadcast_to(gradient, (size, size, 3)) + rng.normal(0, 12, (size, size, 3))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)

    lines = []
    for _ in range(int(rng.integers(1, 4))):
        cls = int(rng.integers(0, len(CLASS_NAMES)))
        w = int(rng.integers(size // 6, size // 2))
        h = int(rng.integers(size // 6, size // 2))
        x0 = int(rng.integers(0, size - w))
        y0 = int(rng.integers(0, size - h))
        colour = tuple(int(c) for c in rng.integers(140, 256, size=3))
        box = [x0, y0, x0 + w - 1, y0 + h - 1]
        if cls == 0:
            draw.rectangle(box, fill=colour)
        elif cls == 1:
            draw.ellipse(box, fill=colour)
        else:
            draw.polygon([(x0 + w / 2, y0), (x0, y0 + h - 1), (x0 + w - 1, y0 + h - 1)], fill=colour)
        lines.append(f"{cls} {(x0 + w / 2) / size:.6f} {(y0 + h / 2) / size:.6f} {w / size:.6f} {h / size:.6f}")
    return image, lines


class UnsafeDataYaml(ValueError):
    """A data YAML asks for something the runner never does (a download, a script)."""


# Ultralytics `exec`s a data YAML's `download:` entry when the validation split is missing,
# and YOLO_OFFLINE does not stop it: a dataset file would be code. Refused before training.
_REFUSED_KEYS = ("download",)
_MAX_DATA_YAML_BYTES = 1024 * 1024


def check_data_yaml(path: Path) -> None:
    """Raise UnsafeDataYaml if the data YAML at `path` has a `download:` key (at top level,
    where Ultralytics reads it). A missing or unreadable file is left to Ultralytics' own
    message; only a parsed mapping is checked."""
    import yaml  # comes with Ultralytics; imported late like numpy above

    path = Path(path)
    if not path.is_file() or path.suffix not in (".yaml", ".yml"):
        return
    if path.stat().st_size > _MAX_DATA_YAML_BYTES:
        raise UnsafeDataYaml(f"data YAML {path} is larger than {_MAX_DATA_YAML_BYTES // 1024} KiB")
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8", errors="replace"))
    except yaml.YAMLError:
        return  # Ultralytics reports the syntax error in its own words
    except RecursionError as error:
        raise UnsafeDataYaml(f"data YAML {path} is nested too deeply") from error
    if isinstance(document, dict):
        for key in _REFUSED_KEYS:
            if key in document:
                raise UnsafeDataYaml(
                    f"data YAML {path} has a '{key}:' entry; the runner never downloads or runs "
                    "dataset scripts — remove it and mount the dataset instead"
                )
