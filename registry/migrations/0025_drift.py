import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("registry", "0024_capture"),
                    migrations.swappable_dependency(settings.AUTH_USER_MODEL)]

    operations = [
        migrations.CreateModel(
            name='Baseline',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('source', models.CharField(choices=[('dataset', 'dataset'), ('capture', 'capture')], max_length=8)),
                ('window_start', models.DateTimeField(blank=True, null=True)),
                ('window_end', models.DateTimeField(blank=True, null=True)),
                ('rows', models.PositiveBigIntegerField(default=0)),
                ('features', models.JSONField(default=dict)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('dataset', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='registry.dataset')),
                ('version', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='baseline', to='registry.modelversion')),
            ],
        ),
        migrations.CreateModel(
            name='DriftSettings',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('psi_threshold', models.FloatField(default=0.2)),
                ('p_value', models.FloatField(default=0.01)),
                ('window_minutes', models.PositiveIntegerField(default=60)),
                ('min_samples', models.PositiveIntegerField(default=200)),
                ('endpoint', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='drift_settings', to='registry.endpoint')),
            ],
        ),
        migrations.CreateModel(
            name='DriftEpisode',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('version', models.PositiveIntegerField()),
                ('started_at', models.DateTimeField()),
                ('ended_at', models.DateTimeField(blank=True, null=True)),
                ('features', models.JSONField(default=list)),
                ('model', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='drift_episodes', to='registry.registeredmodel')),
            ],
            options={
                'ordering': ['model', 'version', '-started_at'],
                'constraints': [models.UniqueConstraint(condition=models.Q(('ended_at__isnull', True)), fields=('model', 'version'), name='one_open_drift_episode')],
            },
        ),
        migrations.CreateModel(
            name='DriftPoint',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('version', models.PositiveIntegerField()),
                ('feature', models.CharField(max_length=200)),
                ('part', models.CharField(default='inputs', max_length=7)),
                ('window_end', models.DateTimeField()),
                ('psi', models.FloatField()),
                ('statistic', models.FloatField()),
                ('p_value', models.FloatField()),
                ('n', models.PositiveIntegerField()),
                ('drifted', models.BooleanField(default=False)),
                ('model', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='drift_points', to='registry.registeredmodel')),
            ],
            options={
                'ordering': ['model', 'version', 'window_end', 'feature'],
                'indexes': [models.Index(fields=['model', 'version', 'window_end'], name='drift_point_time')],
            },
        ),
    ]
