import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("reservations", "0001_initial"),
        ("training", "0008_job_waiting_noticed_at"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="RegisteredModel",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.SlugField(help_text="Lower-case letters, digits and dashes, e.g. pcb-defect.",
                                          max_length=100)),
                ("description", models.CharField(blank=True, max_length=500)),
                ("created_at", models.DateTimeField()),
                ("team", models.ForeignKey(on_delete=django.db.models.deletion.PROTECT,
                                           related_name="registered_models", to="reservations.team")),
            ],
            options={"ordering": ["team__slug", "name"]},
        ),
        migrations.CreateModel(
            name="ModelVersion",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("version", models.PositiveIntegerField()),
                ("metrics", models.JSONField(default=dict, help_text="The run's final validation metrics.")),
                ("data", models.CharField(help_text="The data YAML it was trained on.", max_length=500)),
                ("spec", models.JSONField(default=dict, help_text="The job spec as submitted.")),
                ("weights_sha256", models.CharField(max_length=64)),
                ("note", models.CharField(blank=True, max_length=500)),
                ("promoted_at", models.DateTimeField()),
                ("model", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="versions",
                                            to="training.registeredmodel")),
                ("promoted_by", models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="+",
                                                  to=settings.AUTH_USER_MODEL)),
                ("run", models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="model_versions",
                                          to="training.run")),
            ],
            options={"ordering": ["model", "-version"]},
        ),
        migrations.AddConstraint(
            model_name="registeredmodel",
            constraint=models.UniqueConstraint(fields=("team", "name"), name="registeredmodel_unique_team_name"),
        ),
        migrations.AddConstraint(
            model_name="modelversion",
            constraint=models.UniqueConstraint(fields=("model", "version"), name="modelversion_unique_model_version"),
        ),
    ]
