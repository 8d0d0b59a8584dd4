"""One ChoiceSet per enumeration (as NetBox's dcim/choices.py): each value with its label and,
where the console or the API docs explain it, its help text. The model field, the serializer,
the console form and the templates read the set, so a value or its wording is written once.
The values are stored in the database and sent over the API: never change one."""

from __future__ import annotations

from enum import nonmember

from django.db import models


class ChoiceSet(models.TextChoices):
    """Django's TextChoices (value, label) plus `HELP`, what each value means. A subclass
    declares `HELP = nonmember({MEMBER: "...", ...})` under its members (nonmember: the dict is
    not a choice itself; in the class body a member is still its value or (value, label))."""

    HELP = nonmember({})

    @classmethod
    def help_table(cls) -> dict[str, str]:
        return {key[0] if isinstance(key, tuple) else key: text
                for key, text in cls.HELP.items()}

    @property
    def help_text(self) -> str:
        return self.help_table().get(self.value, "")

    @classmethod
    def help_for(cls, value: str) -> str:
        """The help of a raw value (a template holds the string, not the member); an unknown
        value explains itself."""
        return cls.help_table().get(value, value)

    @classmethod
    def help_lines(cls) -> str:
        """"value: help; ..." for every value, for an API field's help text."""
        table = cls.help_table()
        return "; ".join(f"{value}: {table[value]}" for value in cls.values if value in table)


class VersionStatus(ChoiceSet):
    """Where a version is in its validation; the console shows the help as the badge tooltip."""

    UPLOADED = "uploaded"
    VALIDATING = "validating"
    READY = "ready"
    FAILED = "failed"

    HELP = nonmember({
        UPLOADED: "queued for validation",
        VALIDATING: "being checked and loaded",
        READY: "validated; can serve",
        FAILED: "validation failed",
    })


class GraphOptimizationLevel(ChoiceSet):
    """onnxruntime's graph optimisation level for a version (serving.core.runtime maps it to
    ORT's)."""

    DISABLE = "disable", "disable"
    BASIC = "basic", "basic"
    EXTENDED = "extended", "extended"
    ALL = "all", "all"

    HELP = nonmember({
        DISABLE: "no graph optimisations",
        BASIC: "constant folding and redundant node elimination",
        EXTENDED: "basic plus node fusions",
        ALL: "extended plus layout optimisations (the default)",
    })


class RollbackOrder(ChoiceSet):
    """How a rollback swaps the stable version on the replicas."""

    LOAD_FIRST = "load-first", "load first (no gap)"
    UNLOAD_FIRST = "unload-first", "unload first (frees memory; brief gap)"

    HELP = nonmember({
        LOAD_FIRST: "(default) replicas load and warm the target before they switch, so "
                    "nothing fails",
        UNLOAD_FIRST: "for memory-short machines: the old stable is unloaded everywhere first, "
                      "and unpinned requests get 503 until the target is loaded",
    })


class ApprovalState(ChoiceSet):
    """A version's approval for promotion, decided by an engineer or admin other than its
    uploader. Only models that require approval act on it (registry.services.approvals)."""

    PENDING = "pending", "pending"
    APPROVED = "approved", "approved"
    REJECTED = "rejected", "rejected"

    HELP = nonmember({
        PENDING: "no decision yet",
        APPROVED: "approved for promotion",
        REJECTED: "rejected: not to be promoted",
    })


class TaskType(ChoiceSet):
    """What a version's answers are, for model quality (registry/monitoring/quality.py): the
    metrics its feedback is judged by. Empty on a version: inferred from its output signature."""

    CLASSIFIER = "classifier", "classifier"
    REGRESSOR = "regressor", "regressor"

    HELP = nonmember({
        CLASSIFIER: "labels are class indexes (or names): accuracy, macro F1, AUC",
        REGRESSOR: "labels are numbers: RMSE, MAE",
    })
