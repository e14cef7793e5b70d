"""The parsed job spec, stored at submit. Jobs submitted before it get theirs from the raw
document; what it left out stays None (the image's defaults fill it when a run starts)."""

from django.db import migrations, models


def fill(apps, schema_editor):
    TrainingJob = apps.get_model("training", "TrainingJob")
    for job in TrainingJob.objects.filter(parsed_spec={}):
        raw = job.spec if isinstance(job.spec, dict) else {}
        resources = raw.get("resources") or {}
        yolo = raw.get("yolo")
        job.parsed_spec = {
            "task_name": job.name, "image": raw.get("image", ""), "team": raw.get("team", ""),
            "gpus": job.gpus_needed, "priority": job.priority, "checkpointable": job.checkpointable,
            "yolo": {
                "model": yolo.get("model"), "data": yolo.get("data"), "epochs": yolo.get("epochs"),
                "imgsz": yolo.get("imgsz"), "batch": yolo.get("batch"), "extra": yolo.get("extra") or {},
                "export": yolo.get("export"),
            } if isinstance(yolo, dict) and not job.argv else None,
            "command": list(job.argv or []),
            "memory": str(resources["memory"]) if resources.get("memory") else None,
            "cpu": str(resources["cpu"]) if resources.get("cpu") else None,
            "timeout_s": job.timeout_s, "estimated_duration_s": job.estimated_duration_s,
        }
        job.save(update_fields=["parsed_spec"])


class Migration(migrations.Migration):
    dependencies = [("training", "0003_run_handle")]

    operations = [
        migrations.AddField(
            model_name="trainingjob",
            name="parsed_spec",
            field=models.JSONField(blank=True, default=dict, help_text="The normalized job spec."),
        ),
        migrations.RunPython(fill, migrations.RunPython.noop),
    ]
