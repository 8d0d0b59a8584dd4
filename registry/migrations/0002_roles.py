from django.db import migrations

ROLES = ("viewer", "engineer", "admin")


def create_roles(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    for role in ROLES:
        Group.objects.get_or_create(name=role)


def create_revision(apps, schema_editor):
    RouteRevision = apps.get_model("registry", "RouteRevision")
    RouteRevision.objects.get_or_create(pk=1, defaults={"value": 0})


class Migration(migrations.Migration):
    dependencies = [("registry", "0001_initial"), ("auth", "0012_alter_user_first_name_max_length")]
    operations = [
        migrations.RunPython(create_roles, migrations.RunPython.noop),
        migrations.RunPython(create_revision, migrations.RunPython.noop),
    ]
