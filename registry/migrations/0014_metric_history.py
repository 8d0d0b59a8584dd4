from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("registry", "0013_merge_0012_approval_0012_version_metrics"),
    ]

    operations = [
        migrations.AddField(
            model_name="metricsample",
            name="level",
            field=models.PositiveSmallIntegerField(
                default=0, help_text="history tier: 1 = last sample of its minute, 2 = of its 10 "
                                     "minutes (registry/metrics_retention.py keeps each tier for "
                                     "its own time)"),
        ),
        migrations.AddIndex(
            model_name="metricsample",
            index=models.Index(fields=["level", "bucket"], name="metric_sample_tier"),
        ),
    ]
