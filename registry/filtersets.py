"""One FilterSet per list: the API list and the console list use the same filters."""

import django_filters
from django.db.models import Q

from registry.models import AuditEvent, RegisteredModel


class ModelFilterSet(django_filters.FilterSet):
    search = django_filters.CharFilter(method="filter_search", label="name or description")
    tag = django_filters.CharFilter(method="filter_tag")
    archived = django_filters.BooleanFilter()

    class Meta:
        model = RegisteredModel
        fields = ["search", "tag", "archived"]

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
