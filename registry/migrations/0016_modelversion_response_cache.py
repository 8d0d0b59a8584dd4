"""ModelVersion.response_cache: answer repeated requests from the replica's response cache
(off for every existing version, as for new ones)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("registry", "0015_merge_0014_loadtest_0014_metric_history")]

    operations = [
        migrations.AddField(
            model_name="modelversion",
            name="response_cache",
            field=models.BooleanField(default=False),
        ),
    ]
