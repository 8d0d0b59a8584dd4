"""Template helpers: the health bar, the user's role, status badges, form fields and small
formatters."""

from __future__ import annotations

import json

from django import template
from django.conf import settings
from django.forms import BoundField
from django.utils.html import format_html

from registry.choices import ApprovalState, VersionStatus
from registry.roles import has_role, role_of
from registry.selectors import may_read_audit, my_teams

from .. import health

register = template.Library()

@register.inclusion_tag("console/partials/health_bar.html")
def health_bar(db: health.Check | None = None) -> dict:
    checks = health.checks(db)
    state = health.overall(checks)
    return {"checks": checks, "state": state, "all_ok": state == "ok"}


@register.filter
def role(user) -> str:
    """The global role, or else the user's team roles ("engineer in fraud")."""
    held = role_of(user)
    if held:
        return held
    teams = my_teams(user)
    if not teams:
        return "no role"
    return ", ".join(f"{t['role']} in {t['team']}" for t in teams[:3]) + (
        f" (+{len(teams) - 3})" if len(teams) > 3 else "")


@register.simple_tag
def sso_label() -> str:
    """The single sign-on button's text; empty when single sign-on is off."""
    return settings.OIDC_LABEL if settings.SSO_ENABLED else ""


@register.filter
def can(user, needed: str) -> bool:
    return has_role(user, needed)


@register.filter
def reads_audit(user) -> bool:
    """A global admin, or an admin of a team (who reads that team's part of the log)."""
    return user.is_authenticated and may_read_audit(user)


@register.simple_tag
def status_badge(status: str):
    """Status as a word (never colour alone), with a tooltip saying what it means."""
    return format_html('<span class="badge badge-{0}" title="{1}">{0}</span>', status,
                       VersionStatus.help_for(status))


@register.simple_tag
def approval_badge(approval: str):
    """A version's approval as a word; shown only where its model requires approval."""
    return format_html('<span class="badge badge-approval-{0}" title="{1}">{0}</span>',
                       approval, ApprovalState.help_for(approval))


@register.simple_tag
def access_badge(access):
    """An endpoint's predict-key protection as a word: protected (a key is needed) or open."""
    if access.refusing_all:
        return format_html('<span class="badge badge-protected" title="{}">protected, no keys'
                           '</span>', "every call is refused (401) until a key is created"
                           + ("" if access.required else " or the endpoint is opened"))
    if access.protected:
        return format_html('<span class="badge badge-protected" title="{}">protected</span>',
                           "requests need one of this endpoint's predict keys")
    return format_html('<span class="badge badge-open" title="{}">open</span>',
                       "anyone who can reach /v2 may call it: no key needed")


@register.inclusion_tag("console/partials/field.html")
def render_field(field: BoundField, note: str = "", **attrs) -> dict:
    """One form field as the console lays it out: its label, its widget (a checkbox before its
    label, a weight slider with its live number), help and errors. The form owns the value,
    choices and label; `attrs` (size, id) go on the widget, `note` is a muted aside in the label.
    """
    return {"field": field, "id": attrs.get("id") or field.auto_id, "note": note,
            "widget": field.as_widget(attrs=attrs), "kind": field.widget_type}


@register.filter
def short_sha(sha: str) -> str:
    return (sha or "")[:12]


@register.filter
def filesize(n) -> str:
    try:
        size = float(n)
    except (TypeError, ValueError):
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _tensor(t: dict) -> str:
    shape = t.get("shape")
    dims = "?" if shape is None else "×".join("N" if d == -1 else str(d) for d in shape)
    return f"{t.get('name')}: {t.get('datatype')}[{dims}]"


@register.filter
def tensor(t: dict | None) -> str:
    return _tensor(t) if t else "—"


@register.filter
def tensor_type(t: dict | None) -> str:
    """datatype[dims] without the name (the diff's first column already names it)."""
    return _tensor(t).split(": ", 1)[1] if t else "—"


@register.filter
def signature_summary(signature: dict | None) -> str:
    if not signature or not signature.get("inputs"):
        return "—"
    ins = ", ".join(_tensor(t) for t in signature["inputs"])
    outs = ", ".join(_tensor(t) for t in signature.get("outputs") or [])
    return f"{ins} → {outs}"


@register.filter
def opsets(value: dict | None) -> str:
    """{"": 17, "ai.onnx.ml": 3} -> "ai.onnx 17, ai.onnx.ml 3": ONNX names the default domain
    by the empty string."""
    if not value:
        return "—"
    return ", ".join(f"{domain or 'ai.onnx'} {version}"
                     for domain, version in sorted(value.items(), key=lambda kv: kv[0] != ""))


@register.filter
def as_json(value, indent: int = 0) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=indent or None, sort_keys=True, default=str)


@register.filter
def shape(value) -> str:
    if value is None:
        return "unknown rank"
    return "[" + ", ".join("N" if d == -1 else str(d) for d in value) + "]"


@register.filter
def pct(fraction) -> str:
    """0.0123 -> "1.23" (a share as a percentage, for error rates and agreement)."""
    try:
        value = float(fraction) * 100
    except (TypeError, ValueError):
        return "—"
    return f"{value:.2f}".rstrip("0").rstrip(".") if value else "0"


JOB_HELP = {
    "queued": "waiting for a worker",
    "running": "a worker holds it",
    "succeeded": "finished; the result can be downloaded until it expires",
    "failed": "stopped with an error",
    "cancelled": "stopped by a user; partial output removed",
}


@register.simple_tag
def job_badge(status: str):
    """A job's status in words (the mark before it differs too, never colour alone)."""
    return format_html('<span class="badge badge-job-{0}" title="{1}">{0}</span>', status,
                       JOB_HELP.get(status, status))


@register.filter
def duration(seconds) -> str:
    """1.5 -> "1.5 s", 75 -> "1 min 15 s", 4000 -> "1 h 06 min"."""
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        return "—"
    if s < 60:
        return f"{s:.1f} s"
    minutes, secs = divmod(int(round(s)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


@register.filter
def metric(value) -> str:
    """An evaluation metric for a table: up to 4 decimals, no trailing zeros; "—" when absent."""
    if value is None:
        return "—"
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 1000:
        return f"{value:,.1f}"
    return f"{value:.4f}".rstrip("0").rstrip(".") if abs(value) >= 1e-4 else f"{value:.2e}"


@register.filter
def signed_metric(value) -> str:
    """A difference, with its sign: +0.02, −3."""
    if value is None:
        return "—"
    return ("+" if value > 0 else "−" if value < 0 else "±") + metric(abs(value))


@register.filter
def audit_sentence(event) -> str:
    """One audit event as a sentence (console/audit_text.py)."""
    from ..audit_text import describe

    return describe(event)


@register.filter
def audit_changes(event) -> list:
    """Only the fields an audit event changed, each with its before and after."""
    from ..audit_text import changes

    return changes(event.before, event.after)


@register.filter
def rate(value) -> str:
    """A rate a person reads: thousands separators, decimals only where they matter
    (698539.6 -> "698,540"; 12.34 -> "12.3"; 0.456 -> "0.46")."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "—"
    if abs(number) >= 100:
        return f"{number:,.0f}"
    return f"{number:,.1f}" if abs(number) >= 10 else f"{number:,.2f}"
