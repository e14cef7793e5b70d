from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("training", "0005_merge_0004_image_digest_0004_job_parsed_spec")]

    operations = [
        migrations.AddField(model_name="run", name="stop_sent_at", field=models.DateTimeField(blank=True, null=True)),
        migrations.AddField(model_name="run", name="stops_sent", field=models.PositiveSmallIntegerField(default=0)),
    ]
