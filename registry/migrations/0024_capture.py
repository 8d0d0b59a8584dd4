from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("registry", "0023_config_search")]
    operations = [
        migrations.AddField(
            model_name="endpoint",
            name="capture_max_bytes",
            field=models.PositiveIntegerField(default=65536),
        ),
        migrations.AddField(
            model_name="endpoint",
            name="capture_mode",
            field=models.CharField(choices=[("inputs", "inputs"), ("outputs", "outputs"),
                                            ("both", "both")], default="both", max_length=7),
        ),
        migrations.AddField(
            model_name="endpoint",
            name="capture_percent",
            field=models.DecimalField(decimal_places=3, default=0, max_digits=6),
        ),
        migrations.AddField(
            model_name="endpoint",
            name="capture_retention_days",
            field=models.PositiveIntegerField(default=30),
        ),
    ]
