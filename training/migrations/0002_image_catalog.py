"""Seed the trainer image catalog (deploy/images builds these tags)."""

from django.db import migrations

CATALOG = [
    ("v8n-cu118", "YOLOv8 nano, CUDA 11.8", {"ultralytics": "8.4.190", "torch": "2.14.1", "cuda": "11.8"},
     {"16384": 64, "24576": 96, "40960": 128, "81920": 256}),
    ("v8x-cu118", "YOLOv8 extra-large, CUDA 11.8", {"ultralytics": "8.4.190", "torch": "2.14.1", "cuda": "11.8"},
     {"16384": 8, "24576": 12, "40960": 16, "81920": 32}),
    ("v10l-cu121", "YOLOv10 large, CUDA 12.1", {"ultralytics": "8.4.190", "torch": "2.14.1", "cuda": "12.1"},
     {"16384": 12, "24576": 16, "40960": 24, "81920": 48}),
]


def seed(apps, schema_editor):
    image_model = apps.get_model("training", "TrainingImage")
    for tag, description, versions, batches in CATALOG:
        image_model.objects.get_or_create(
            name="yolo", tag=tag,
            defaults={"description": description, "framework_versions": versions, "recommended_batch": batches,
                      "default_hyperparameters": {"imgsz": 640, "epochs": 100, "optimizer": "auto"}},
        )


class Migration(migrations.Migration):
    dependencies = [("training", "0001_initial")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
