from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("training", "0002_image_catalog")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="handle",
            field=models.JSONField(blank=True, default=dict, help_text="The executor's handle, as start() returned it."),
        ),
    ]
