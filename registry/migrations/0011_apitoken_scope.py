from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('registry', '0010_replicaheartbeat_behind_since'),
    ]

    operations = [
        migrations.AddField(
            model_name='apitoken',
            name='read_only',
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name='apitoken',
            name='last_used_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
