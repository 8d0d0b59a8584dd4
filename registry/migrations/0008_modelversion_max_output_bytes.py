"""ModelVersion.max_output_bytes: a version's output budget per request (0 = the replica's
default, MMC_MAX_OUTPUT_BYTES), so existing versions keep the replica's default."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("registry", "0007_endpoint_rollout_state")]

    operations = [
        migrations.AddField(
            model_name="modelversion",
            name="max_output_bytes",
            field=models.PositiveBigIntegerField(default=0),
        ),
    ]
