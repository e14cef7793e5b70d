from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from training.runner.dataset import make_demo_dataset

DEMO_DATASET_DIR = "demo-shapes"


def demo_dataset_root() -> Path:
    """Under the shared data root, so every team's jobs may read it."""
    return Path(settings.VAR_DIR) / "datasets" / "shared" / DEMO_DATASET_DIR


class Command(BaseCommand):
    help = "Write a small synthetic detection dataset (shapes, YOLO labels, data.yaml) for demos."

    def add_arguments(self, parser):
        parser.add_argument("--root", type=Path, default=None)
        parser.add_argument("--train-images", type=int, default=64)
        parser.add_argument("--val-images", type=int, default=16)
        parser.add_argument("--imgsz", type=int, default=128)

    def handle(self, *args, root: Path | None, train_images: int, val_images: int, imgsz: int, **options):
        data_yaml = make_demo_dataset(
            root or demo_dataset_root(), train_images=train_images, val_images=val_images, imgsz=imgsz
        )
        self.stdout.write(str(data_yaml))
