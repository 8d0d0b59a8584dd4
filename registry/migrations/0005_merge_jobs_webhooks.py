from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("registry", "0004_jobs"), ("registry", "0004_webhooks")]
    operations = []
