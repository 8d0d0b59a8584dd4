"""Endpoint.settings held rollout *state* (automated analysis, blue-green, a pending unload-first
rollback): renamed to rollout_state, and analysis plans stored before a plan field existed are
upgraded to the full shape. A plan stored before min_p99_increase_ms gets 0 ms, so it keeps
judging as it did when it was started (no tolerance)."""

from django.db import migrations

PLAN_DEFAULTS_OF_OLD_PLANS = {"min_p99_increase_ms": 0.0}
PLAN_DEFAULTS = {"steps": [5, 25, 50, 100], "bake_seconds": 60.0, "max_p99_ratio": 1.5,
                 "max_error_rate": 0.01, "min_requests": 100}


def upgrade_plans(apps, schema_editor):
    Endpoint = apps.get_model("registry", "Endpoint")
    for ep in Endpoint.objects.exclude(rollout_state={}):
        state = dict(ep.rollout_state or {})
        analysis = state.get("analysis")
        if not analysis:
            continue
        plan = {**PLAN_DEFAULTS, **PLAN_DEFAULTS_OF_OLD_PLANS, **(analysis.get("plan") or {})}
        analysis = {**analysis, "plan": plan, "paused": bool(analysis.get("paused")),
                    "started_at": analysis.get("started_at") or analysis["step_started_at"]}
        state["analysis"] = analysis
        Endpoint.objects.filter(pk=ep.pk).update(rollout_state=state)


class Migration(migrations.Migration):
    dependencies = [("registry", "0006_dataset_expiry")]

    operations = [
        migrations.RenameField("endpoint", "settings", "rollout_state"),
        migrations.RunPython(upgrade_plans, migrations.RunPython.noop),
    ]
