"""Console forms: parse and present input only; rules stay in registry services."""

from __future__ import annotations

from collections.abc import Iterable

from django import forms

from registry.choices import RollbackOrder
from registry.roles import ROLES, TEAM_ROLES
from registry.routing import AnalysisPlan

PLAN = AnalysisPlan()  # the automated canary's defaults, offered as the plan fields' initial values


class ModelCreateForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="lowercase letters, digits, - _ .")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))
    tags = forms.CharField(required=False, help_text="comma-separated, e.g. vision, nlp")

    def __init__(self, *args, teams: list[str] | None = None, **kwargs) -> None:
        """`teams`: where the user may register a model; a choice when there are several."""
        super().__init__(*args, **kwargs)
        if teams and len(teams) > 1:
            self.fields["team"] = forms.ChoiceField(
                choices=[(t, t) for t in teams], label="Team",
                initial="default" if "default" in teams else teams[0],
                help_text="the team that owns the model: its members see and change it")

    def clean_tags(self) -> list[str]:
        return [t.strip() for t in self.cleaned_data["tags"].split(",") if t.strip()]


class ModelEditForm(ModelCreateForm):
    """Description and tags of an existing model (its name is its identity: not editable)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        del self.fields["name"]


class AliasSetForm(forms.Form):
    alias = forms.CharField(max_length=64, label="Alias")
    version = forms.IntegerField(min_value=1, label="Version")


class DeployForm(forms.Form):
    version = forms.IntegerField(min_value=1)
    reason = forms.CharField(required=False, max_length=500)


class ApprovalSettingForm(forms.Form):
    requires_approval = forms.BooleanField(required=False, label="Promotion needs approval")


class ApprovalForm(forms.Form):
    """Approve or reject a version; the service requires the comment to reject."""

    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    comment = forms.CharField(required=False, max_length=2000, label="Comment",
                              widget=forms.Textarea(attrs={"rows": 3}),
                              help_text="required to reject; kept with the decision")


class DiffForm(forms.Form):
    a = forms.IntegerField(min_value=1, label="Version A")
    b = forms.IntegerField(min_value=1, label="Version B")


class ReasonForm(forms.Form):
    """Every rollout action takes an optional reason; it goes into the audit log."""

    reason = forms.CharField(required=False, max_length=500, label="Reason")

    def service_kwargs(self) -> dict:
        return dict(self.cleaned_data)


class VersionReasonForm(ReasonForm):
    """An action on one version; `versions` (the numbers the page offers) makes it a picker."""

    version = forms.IntegerField(min_value=1)
    version_label = "Version"  # a subclass names the version it asks for

    def __init__(self, *args, versions: Iterable[int] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["version"]
        field.label = self.version_label
        if versions is not None:
            field.widget = forms.Select(choices=[(n, f"v{n}") for n in versions])

    def service_kwargs(self) -> dict:
        data = dict(self.cleaned_data)
        data["version_number"] = data.pop("version")
        return data


class WeightSlider(forms.NumberInput):
    """A 0-100 % range input that says its value to screen readers and names the <output>
    beside it (console/partials/field.html draws that; static/js/deployment.js keeps it live)."""

    input_type = "range"

    def __init__(self, attrs: dict | None = None) -> None:
        super().__init__({"step": "1", **(attrs or {})})

    def use_required_attribute(self, initial) -> bool:
        return False  # a slider always has a value

    def get_context(self, name, value, attrs) -> dict:
        context = super().get_context(name, value, attrs)
        widget = context["widget"]
        widget["attrs"]["aria-valuetext"] = f"{widget['value']} percent"
        widget["attrs"]["data-output"] = f"{widget['attrs'].get('id', name)}-value"
        return context


def weight_field(**kwargs) -> forms.IntegerField:
    return forms.IntegerField(min_value=0, max_value=100, label="Candidate weight (%)",
                              widget=WeightSlider, **kwargs)


class WeightForm(ReasonForm):
    weight = weight_field()


class RollbackForm(VersionReasonForm):
    version_label = "To version"
    order = forms.ChoiceField(choices=RollbackOrder.choices, initial=RollbackOrder.LOAD_FIRST,
                              required=False, label="Order")

    def service_kwargs(self) -> dict:
        data = super().service_kwargs()
        data["order"] = data["order"] or RollbackOrder.LOAD_FIRST.value
        return data


class BlueGreenDeployForm(VersionReasonForm):
    version_label = "Version for the idle colour"


class ShadowStartForm(VersionReasonForm):
    version_label = "Shadow version"


def _plain(number: float) -> float | int:
    """60.0 -> 60: a whole number shows (and posts back) without a decimal point."""
    return int(number) if float(number).is_integer() else number


class CanaryForm(VersionReasonForm):
    """Start a canary by hand (a weight) or with the automated analysis (a plan)."""

    version_label = "Candidate version"
    weight = weight_field(initial=10)
    automated = forms.BooleanField(
        required=False, label="Let the automated analysis drive the weights",
        # what the confirmation adds when ticked (static/js/app.js, data-confirm-template)
        widget=forms.CheckboxInput(attrs={"data-note": " (the analysis will drive the weights)"}))
    steps = forms.CharField(required=False, initial=", ".join(map(str, PLAN.steps)),
                            label="Steps (%)")
    bake_seconds = forms.FloatField(required=False, min_value=0,
                                    initial=_plain(PLAN.bake_seconds),
                                    widget=forms.NumberInput(attrs={"step": "1"}),
                                    label="Bake time per step (s)")

    def clean_steps(self) -> list[int] | None:
        raw = self.cleaned_data["steps"].replace(" ", "")
        if not raw:
            return None
        try:
            return [int(s) for s in raw.split(",") if s]
        except ValueError:
            raise forms.ValidationError(
                f"steps are whole percentages, e.g. {self.fields['steps'].initial}") from None

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


class WebhookForm(forms.Form):
    """A webhook subscription; the service checks the URL (public or allow-listed)."""

    name = forms.CharField(required=False, max_length=100, label="Name")
    url = forms.URLField(max_length=500, label="URL", assume_scheme="https",
                         help_text="Each event is POSTed here as JSON, signed with the secret.")
    model = forms.CharField(required=False, max_length=100, label="Model",
                            help_text="Only this model's events; empty = every model.")
    events = forms.MultipleChoiceField(required=False, label="Events",
                                       widget=forms.CheckboxSelectMultiple,
                                       help_text="None ticked = every event.")

    def __init__(self, *args, events: Iterable[str] = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["events"].choices = [(e, e) for e in events if e != "ping"]


# -- access: API tokens, users, predict keys --------------------------------------------------


class TokenCreateForm(forms.Form):
    name = forms.CharField(max_length=100, label="Name",
                           help_text="what it is for, e.g. laptop, ci-train-pipeline")
    expires_in_days = forms.IntegerField(min_value=1, max_value=3650, initial=90,
                                         label="Expires in (days)")
    read_only = forms.BooleanField(required=False, label="Read-only",
                                   help_text="it may only read, whatever your role")


class ReplicaCredentialForm(forms.Form):
    name = forms.CharField(max_length=100, label="Name",
                           help_text="which replicas show it, e.g. eu-west-fleet")


class UserCreateForm(forms.Form):
    username = forms.CharField(max_length=150, label="Username")
    email = forms.EmailField(required=False, label="Email")
    role = forms.ChoiceField(choices=[(r, r) for r in ROLES], initial="viewer", label="Role")
    password = forms.CharField(required=False, label="Initial password",
                               widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
                               help_text="leave empty to generate one (shown once)")


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=[(r, r) for r in ROLES], label="Role")


class TeamCreateForm(forms.Form):
    name = forms.CharField(max_length=64, label="Team name",
                           help_text="lowercase letters, digits, - _ .")
    description = forms.CharField(required=False, max_length=500, label="Description")


class MemberForm(forms.Form):
    username = forms.CharField(max_length=150, label="User")
    role = forms.ChoiceField(choices=[(r, r) for r in TEAM_ROLES], initial="viewer",
                             label="Role in the team")

    def __init__(self, *args, users: list[str] | None = None, **kwargs) -> None:
        """`users`: offered as a picker (active users not yet in the team)."""
        super().__init__(*args, **kwargs)
        if users is not None:
            self.fields["username"] = forms.ChoiceField(choices=[(u, u) for u in users],
                                                        label="User")


class MoveModelForm(forms.Form):
    model = forms.CharField(max_length=100, label="Model")

    def __init__(self, *args, models: list[str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if models is not None:
            self.fields["model"] = forms.ChoiceField(choices=[(m, m) for m in models],
                                                     label="Model")


class PredictKeyForm(forms.Form):
    name = forms.CharField(max_length=64, label="Key name",
                           help_text="who uses it, e.g. checkout-service")


class LimitsForm(forms.Form):
    """An endpoint's or a key's limits (0: none); maxima are the limits service's to check."""

    rps = forms.FloatField(min_value=0, label="Requests per second",
                           help_text="per replica (token bucket); 0: no limit")
    burst = forms.IntegerField(min_value=0, label="Burst",
                               help_text="requests let through at once; 0: ceil(rps)")
    daily_quota = forms.IntegerField(min_value=0, label="Daily quota",
                                     help_text="requests per UTC day, all replicas; 0: none")

    @classmethod
    def of(cls, row, prefix: str) -> LimitsForm:
        """The form filled in with `row`'s current limits (ids start with `prefix`)."""
        return cls(auto_id=f"{prefix}-%s", initial={
            "rps": row.rate_limit_rps if row else 0, "burst": row.rate_limit_burst if row else 0,
            "daily_quota": row.daily_quota if row else 0})


class ScaleToZeroForm(forms.Form):
    """An endpoint's idle timeout; the scaling service checks the range."""

    after_seconds = forms.IntegerField(label="Scale to zero after (s)", help_text=(
        "idle seconds before replicas unload the versions; 0: never"))

    @classmethod
    def of(cls, endpoint) -> ScaleToZeroForm:
        return cls(auto_id="stz-%s", initial={
            "after_seconds": endpoint.scale_to_zero_after_seconds if endpoint else 0})


class LoadTestForm(forms.Form):
    """A load test of the version page's version; the service checks bounds and the rules."""

    requests = forms.IntegerField(required=False, min_value=1, initial=1000, label="Requests",
                                  help_text="or leave empty and give seconds")
    seconds = forms.IntegerField(required=False, min_value=1, label="Seconds")
    concurrency = forms.IntegerField(min_value=1, initial=4, label="Concurrency")
    replica = forms.ChoiceField(required=False, label="Replica", choices=[])
    confirm = forms.BooleanField(required=False, label="It takes real traffic: run anyway")
    key = forms.CharField(required=False, label="Predict key", strip=True,
                          widget=forms.PasswordInput(attrs={"autocomplete": "off"}),
                          help_text="used for this run only, never stored")

    def __init__(self, *args, replicas: list[str] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["replica"].choices = [("", "default (embedded / first live)"),
                                          *((r, r) for r in replicas)]

    def service_kwargs(self) -> dict:
        return dict(self.cleaned_data)


def _whole_numbers(raw: str) -> list[int]:
    try:
        return [int(s) for s in raw.replace(" ", "").split(",") if s]
    except ValueError:
        raise forms.ValidationError("whole numbers separated by commas, e.g. 0, 8") from None


class ConfigSearchForm(forms.Form):
    """A serving-config search of the version page's version: the values to try per setting
    (empty: the version's own), how each point is measured, the p99 budget. The service checks
    every bound; labels differ from the load test's and the serving form's on the same page."""

    GRID = {"max_batch_size": "Try batch sizes", "max_queue_delay_us": "Try queue delays (µs)",
            "instance_count": "Try instance counts", "intra_op_threads": "Try thread counts"}
    CACHE = {"": [], "off": [False], "on": [True], "both": [False, True]}

    max_batch_size = forms.CharField(required=False, label=GRID["max_batch_size"],
                                     help_text="max batch size; e.g. 0, 8 (0: no batching)")
    max_queue_delay_us = forms.CharField(required=False, label=GRID["max_queue_delay_us"],
                                         help_text="how long a request waits for a batch")
    instance_count = forms.CharField(required=False, label=GRID["instance_count"],
                                     help_text="copies of the model per replica")
    intra_op_threads = forms.CharField(required=False, label=GRID["intra_op_threads"],
                                       help_text="onnxruntime threads per run (0: its default)")
    response_cache = forms.ChoiceField(
        required=False, label="Try the cache",
        choices=[("", "as it is"), ("off", "off"), ("on", "on"), ("both", "off, then on")])
    concurrency = forms.IntegerField(min_value=1, initial=4, label="In flight",
                                     help_text="requests at once while a point is measured")
    seconds = forms.IntegerField(min_value=1, initial=5, label="Seconds per point")
    p99_budget_ms = forms.FloatField(min_value=0, initial=100, label="p99 budget (ms)",
                                     help_text="the best point keeps p99 within it")
    replica = forms.ChoiceField(required=False, label="Measure on replica", choices=[])
    confirm = forms.BooleanField(required=False, label="It takes real traffic: sweep anyway")
    key = forms.CharField(required=False, label="Predict key for the sweep", strip=True,
                          widget=forms.PasswordInput(attrs={"autocomplete": "off"}),
                          help_text="used for this search only, never stored")

    def __init__(self, *args, replicas: Iterable[str] = (), **kwargs):
        kwargs.setdefault("auto_id", "cs-%s")  # the load test's form uses the default ids
        super().__init__(*args, **kwargs)
        self.fields["replica"].choices = [("", "default (embedded / first live)"),
                                          *((r, r) for r in replicas)]

    @classmethod
    def for_version(cls, version, *, replicas: Iterable[str] = (), batchable: bool = True
                    ) -> ConfigSearchForm:
        """A first grid worth running: batching off and on (where the inputs allow it) times
        one and two instances, the version's own values among them."""
        def around(own: int, other: int) -> str:
            return ", ".join(map(str, sorted({own, other})))

        initial = {"instance_count": around(version.instance_count,
                                            2 if version.instance_count == 1 else 1)}
        if batchable:
            initial["max_batch_size"] = around(version.max_batch_size,
                                               0 if version.max_batch_size else 8)
        return cls(initial=initial, replicas=replicas)

    def clean(self) -> dict:
        data = super().clean()
        for name in self.GRID:
            if name in data:
                try:
                    data[name] = _whole_numbers(data[name])
                except forms.ValidationError as exc:
                    self.add_error(name, exc)
        return data

    def service_kwargs(self) -> dict:
        data = self.cleaned_data
        grid = {name: data[name] for name in self.GRID if data.get(name)}
        if self.CACHE[data.get("response_cache") or ""]:
            grid["response_cache"] = self.CACHE[data["response_cache"]]
        return {"grid": grid, "concurrency": data["concurrency"], "seconds": data["seconds"],
                "p99_budget_ms": data["p99_budget_ms"], "replica": data.get("replica") or "",
                "confirm": data.get("confirm", False), "key": data.get("key") or ""}
