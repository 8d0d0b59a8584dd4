"""Console forms: parse and present input only; rules stay in registry services."""

from __future__ import annotations

from django import forms


class ModelCreateForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="lowercase letters, digits, - _ .")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))
    tags = forms.CharField(required=False, help_text="comma-separated, e.g. vision, team:ads")

    def clean_tags(self) -> list[str]:
        return [t.strip() for t in self.cleaned_data["tags"].split(",") if t.strip()]


class AliasSetForm(forms.Form):
    alias = forms.CharField(max_length=64, label="Alias")
    version = forms.IntegerField(min_value=1, label="Version")


class DeployForm(forms.Form):
    version = forms.IntegerField(min_value=1)
    reason = forms.CharField(required=False, max_length=500)


class DiffForm(forms.Form):
    a = forms.IntegerField(min_value=1, label="Version A")
    b = forms.IntegerField(min_value=1, label="Version B")


class ReasonForm(forms.Form):
    """Every rollout action takes an optional reason; it goes into the audit log."""

    reason = forms.CharField(required=False, max_length=500, label="Reason")

    def service_kwargs(self) -> dict:
        return dict(self.cleaned_data)


class VersionReasonForm(ReasonForm):
    version = forms.IntegerField(min_value=1, label="Version")

    def service_kwargs(self) -> dict:
        data = dict(self.cleaned_data)
        data["version_number"] = data.pop("version")
        return data


class WeightForm(ReasonForm):
    weight = forms.IntegerField(min_value=0, max_value=100, label="Candidate weight (%)")


class RollbackForm(VersionReasonForm):
    order = forms.ChoiceField(choices=[("load-first", "load first (no gap)"),
                                       ("unload-first", "unload first (frees memory; brief gap)")],
                              initial="load-first", required=False)

    def service_kwargs(self) -> dict:
        data = super().service_kwargs()
        data["order"] = data["order"] or "load-first"
        return data


class CanaryForm(VersionReasonForm):
    """Start a canary by hand (a weight) or with the automated analysis (a plan)."""

    weight = forms.IntegerField(min_value=0, max_value=100, initial=10,
                                label="Candidate weight (%)")
    automated = forms.BooleanField(required=False,
                                   label="Let the automated analysis drive the weights")
    steps = forms.CharField(required=False, initial="5, 25, 50, 100", label="Steps (%)")
    bake_seconds = forms.FloatField(required=False, min_value=0, initial=60,
                                    label="Bake time per step (s)")

    def clean_steps(self) -> list[int] | None:
        raw = self.cleaned_data["steps"].replace(" ", "")
        if not raw:
            return None
        try:
            return [int(s) for s in raw.split(",") if s]
        except ValueError:
            raise forms.ValidationError(
                "steps are whole percentages, e.g. 5, 25, 50, 100") from None

    def service_kwargs(self) -> dict:
        data = super().service_kwargs()
        automated, steps, bake = (data.pop("automated"), data.pop("steps"),
                                  data.pop("bake_seconds"))
        if automated:  # the service judges the plan (registry.routing.AnalysisPlan.clean)
            plan = {}
            if steps:
                plan["steps"] = steps
            if bake is not None:
                plan["bake_seconds"] = bake
            data["plan"] = plan
        return data


def error_text(form: forms.Form) -> str:
    """All of a form's errors on one line, for a message."""
    return "; ".join(f"{'' if field == '__all__' else field + ': '}{' '.join(errs)}"
                     for field, errs in form.errors.items())
