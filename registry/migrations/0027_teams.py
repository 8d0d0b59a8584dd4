"""Teams own models. Every model there is goes to the team "default"; global roles keep their
meaning there (registry.roles): nobody gains or loses access by this migration."""

import django.core.validators
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

import registry.models


def to_default_team(apps, schema_editor):
    team_model = apps.get_model("registry", "Team")
    model_model = apps.get_model("registry", "RegisteredModel")
    team, _ = team_model.objects.get_or_create(
        name="default", defaults={"description": "the models registered before teams"})
    model_model.objects.filter(team__isnull=True).update(team=team)


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0026_feedback"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]
    operations = [
        migrations.CreateModel(
            name="Team",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("name", models.CharField(max_length=64, unique=True, validators=[
                    django.core.validators.RegexValidator(
                        "^[a-z0-9][a-z0-9_.-]{0,99}$",
                        "use 1-100 lowercase letters, digits, '-', '_' or '.', starting with a "
                        "letter or digit")])),
                ("description", models.TextField(blank=True, default="")),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={"ordering": ["name"]},
        ),
        migrations.AddField(
            model_name="registeredmodel",
            name="team",
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT,
                                    related_name="models", to="registry.team"),
        ),
        migrations.RunPython(to_default_team, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="registeredmodel",
            name="team",
            field=models.ForeignKey(default=registry.models.default_team_id,
                                    on_delete=django.db.models.deletion.PROTECT,
                                    related_name="models", to="registry.team"),
        ),
        migrations.CreateModel(
            name="TeamMembership",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("role", models.CharField(choices=[("viewer", "viewer"), ("engineer", "engineer"),
                                                   ("approver", "approver"), ("admin", "admin")],
                                          max_length=16)),
                ("source", models.CharField(blank=True, default="", max_length=8)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("team", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                           related_name="memberships", to="registry.team")),
                ("user", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                           related_name="team_memberships",
                                           to=settings.AUTH_USER_MODEL)),
            ],
            options={
                "ordering": ["team__name", "user__username"],
                "constraints": [models.UniqueConstraint(fields=("team", "user"),
                                                        name="one_role_per_team")],
            },
        ),
    ]
