import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("training", "0009_model_registry")]

    operations = [
        migrations.CreateModel(
            name="RunLog",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("storage_name", models.CharField(help_text="The .log.gz on the archive storage.", max_length=300)),
                ("size_bytes", models.BigIntegerField(help_text="Uncompressed.")),
                ("compressed_bytes", models.BigIntegerField()),
                ("sha256", models.CharField(help_text="Of the uncompressed text.", max_length=64)),
                ("line_count", models.PositiveIntegerField()),
                ("collected_at", models.DateTimeField()),
                ("run", models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name="full_log",
                                             to="training.run")),
            ],
        ),
        migrations.CreateModel(
            name="RunLogLine",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("number", models.PositiveIntegerField(help_text="1-based line number.")),
                ("text", models.TextField()),
                ("run", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="log_lines",
                                          to="training.run")),
            ],
            options={"ordering": ["run", "number"]},
        ),
        migrations.AddConstraint(
            model_name="runlogline",
            constraint=models.UniqueConstraint(fields=("run", "number"), name="runlogline_unique_run_number"),
        ),
        migrations.CreateModel(
            name="LogArchive",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("kind", models.CharField(choices=[("run_log", "A run's log lines"), ("telemetry", "GPU telemetry samples"),
                                                   ("notices", "Notices and their deliveries")], max_length=12)),
                ("storage_name", models.CharField(max_length=300, unique=True)),
                ("row_count", models.PositiveIntegerField()),
                ("older_than", models.DateTimeField(help_text="Everything archived was older than this.")),
                ("archived_at", models.DateTimeField()),
                ("restored_at", models.DateTimeField(blank=True, null=True)),
                ("run", models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL,
                                          related_name="archives", to="training.run")),
            ],
            options={"ordering": ["-archived_at", "-id"]},
        ),
    ]
