import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("registry", "0025_drift")]
    operations = [
        migrations.AddField(
            model_name="metricsample",
            name="mirror",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="modelversion",
            name="task",
            field=models.CharField(blank=True, choices=[("classifier", "classifier"),
                                                        ("regressor", "regressor")],
                                   default="", max_length=10),
        ),
        migrations.CreateModel(
            name="Feedback",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("request_id", models.CharField(max_length=128)),
                ("label", models.JSONField()),
                ("received_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("duplicates", models.PositiveIntegerField(default=0)),
                ("status", models.CharField(choices=[("pending", "Pending"), ("joined", "Joined"),
                                                     ("unknown", "Unknown")],
                                            default="pending", max_length=8)),
                ("version", models.PositiveIntegerField(blank=True, null=True)),
                ("role", models.CharField(blank=True, default="", max_length=16)),
                ("predicted_at", models.DateTimeField(blank=True, null=True)),
                ("prediction", models.JSONField(blank=True, null=True)),
                ("late", models.BooleanField(default=False)),
                ("model", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                            related_name="feedback",
                                            to="registry.registeredmodel")),
            ],
            options={
                "indexes": [models.Index(fields=["model", "status"], name="feedback_status"),
                            models.Index(fields=["model", "version", "predicted_at"],
                                         name="feedback_version_time")],
                "constraints": [models.UniqueConstraint(fields=("model", "request_id"),
                                                        name="feedback_request_unique")],
            },
        ),
        migrations.CreateModel(
            name="QualityPoint",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("version", models.PositiveIntegerField()),
                ("window_start", models.DateTimeField()),
                ("window_seconds", models.PositiveIntegerField()),
                ("task", models.CharField(choices=[("classifier", "classifier"),
                                                   ("regressor", "regressor")], max_length=10)),
                ("count", models.PositiveIntegerField(default=0)),
                ("metrics", models.JSONField(default=dict)),
                ("late", models.PositiveIntegerField(default=0)),
                ("computed_at", models.DateTimeField()),
                ("model", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                            related_name="quality_points",
                                            to="registry.registeredmodel")),
            ],
            options={
                "ordering": ["model", "version", "window_start"],
                "constraints": [models.UniqueConstraint(
                    fields=("model", "version", "window_start"), name="quality_point_unique")],
            },
        ),
    ]
