from django.db import migrations, models


def protect_endpoints_with_keys(apps, schema_editor):
    """An endpoint protected implicitly (it has an active key) stays protected explicitly."""
    Endpoint = apps.get_model("registry", "Endpoint")
    EndpointApiKey = apps.get_model("registry", "EndpointApiKey")
    keyed = EndpointApiKey.objects.filter(revoked_at__isnull=True).values("endpoint_id")
    Endpoint.objects.filter(pk__in=keyed).update(protected=True)


class Migration(migrations.Migration):

    dependencies = [
        ("registry", "0020_merge_20261124_0058"),
    ]

    operations = [
        migrations.AddField(
            model_name="endpoint",
            name="protected",
            field=models.BooleanField(default=False),
        ),
        migrations.CreateModel(
            name="TickRecord",
            fields=[
                ("name", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("last_run_at", models.DateTimeField()),
            ],
        ),
        migrations.RunPython(protect_endpoints_with_keys, migrations.RunPython.noop),
    ]
