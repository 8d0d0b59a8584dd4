"""One FilterSet per list: the API list and the console list use the same filters."""

import django_filters
from django import forms
from django.db.models import Q, TextField
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast

from registry.evaluation import LOOKUPS, parse_metadata_condition, parse_metric_condition
from registry.models import AuditEvent, ModelVersion, RegisteredModel


class ModelFilterSet(django_filters.FilterSet):
    search = django_filters.CharFilter(method="filter_search", label="name or description")
    tag = django_filters.CharFilter(method="filter_tag")
    archived = django_filters.BooleanFilter()
    team = django_filters.CharFilter(field_name="team__name", label="owning team")

    class Meta:
        model = RegisteredModel
        fields = ["search", "tag", "archived", "team"]

    def filter_search(self, qs, name, value):
        return qs.filter(Q(name__icontains=value) | Q(description__icontains=value))

    def filter_tag(self, qs, name, value):
        # tags are a JSON list of plain strings; matching the quoted string works on SQLite
        # (no JSON containment there) and PostgreSQL alike.
        return qs.filter(tags__icontains=f'"{value}"')


class AuditFilterSet(django_filters.FilterSet):
    model = django_filters.CharFilter(field_name="model_name")
    actor = django_filters.CharFilter(field_name="actor_name")
    action = django_filters.CharFilter(field_name="action", lookup_expr="startswith")
    since = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = ["model", "actor", "action", "since", "until"]


class RepeatableInput(forms.TextInput):
    """A text input whose value is every occurrence of its name (`?metric=a>1&metric=b<2`)."""

    def value_from_datadict(self, data, files, name):
        return data.getlist(name) if hasattr(data, "getlist") else data.get(name)

    def format_value(self, value):
        return value[0] if isinstance(value, list) and value else super().format_value(value)


class ConditionsField(forms.Field):
    """Every non-blank value parsed by `parse`; a malformed one is a form error (API: 400)."""

    widget = RepeatableInput

    def __init__(self, parse, **kwargs):
        self.parse = parse
        kwargs["required"] = False
        super().__init__(**kwargs)

    def to_python(self, value):
        values = value if isinstance(value, list) else [value] if value else []
        try:
            return [self.parse(v) for v in values if v and v.strip()]
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None


class ConditionsFilter(django_filters.Filter):
    field_class = ConditionsField


class VersionFilterSet(django_filters.FilterSet):
    """`metric=NAME OP NUMBER` (auc>0.9, latency_ms<=20) and `metadata=KEY:VALUE` (team:ml);
    each repeatable, all must hold. A version without the metric or key does not match."""

    metric = ConditionsFilter(method="filter_metric", parse=parse_metric_condition,
                              label="metric (e.g. auc>0.9)")
    metadata = ConditionsFilter(method="filter_metadata", parse=parse_metadata_condition,
                                label="metadata (e.g. team:ml)")
    status = django_filters.CharFilter()

    class Meta:
        model = ModelVersion
        fields = ["metric", "metadata", "status"]

    def filter_metric(self, qs, name, conditions):
        for i, c in enumerate(conditions):
            key = f"_metric_{i}"
            qs = qs.alias(**{key: KeyTransform(c.name, "metrics")}).filter(
                **{f"{key}__isnull": False})
            match = Q(**{f"{key}__{LOOKUPS[c.op]}": c.value})
            qs = qs.exclude(match) if c.op == "!=" else qs.filter(match)
        return qs

    def filter_metadata(self, qs, name, conditions):
        for i, (k, value) in enumerate(conditions):
            # Compared as text: "team:ml" and "epochs:10" match strings and numbers alike.
            key = f"_metadata_{i}"
            text = Cast(KeyTextTransform(k, "metadata"), output_field=TextField())
            qs = qs.alias(**{key: text}).filter(**{key: value})
        return qs
