"""The version page's serving-settings form: its fields and limits come from the service's
CONFIG_FIELDS (registry.services.versions), so the form never restates a range."""

from __future__ import annotations

from django import forms

from registry.choices import GraphOptimizationLevel
from registry.services.versions import CONFIG_FIELDS

#: What each setting does, in the words the form shows under it.
HELP = {
    "max_batch_size": "Largest batch the dynamic batcher forms; 0 = no batching (one request "
                      "per run). Needs a dynamic first dimension.",
    "max_queue_delay_us": "How long a request may wait for others to batch with (µs); 0 = "
                          "run as soon as a batch forms.",
    "max_queue_size": "Requests waiting beyond this are refused (429) instead of queued.",
    "instance_count": "Copies of the model each replica loads (parallel runs).",
    "intra_op_threads": "onnxruntime threads per run; 0 = onnxruntime's default.",
    "max_output_bytes": "Largest answer a request may get; 0 = the replica's default.",
    "preferred_batch_sizes": "Comma-separated batch sizes the batcher prefers to send, e.g. 4, 8.",
    "graph_optimization_level": "onnxruntime graph optimisation for this version.",
    "response_cache": "Answer repeated inputs from the replica's cache instead of running "
                      "the model (deterministic models).",
}
LABELS = {
    "max_batch_size": "Max batch size", "max_queue_delay_us": "Max queue delay (µs)",
    "max_queue_size": "Max queue size", "instance_count": "Instances",
    "intra_op_threads": "Threads per run", "max_output_bytes": "Max output bytes",
    "preferred_batch_sizes": "Preferred batch sizes",
    "graph_optimization_level": "Graph optimisation", "response_cache": "Response cache",
}


class ServingForm(forms.Form):
    """Batching, instances, threads, response cache of one version; `changes(version)` is
    what differs."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for name, (_, low, high) in CONFIG_FIELDS.items():
            self.fields[name] = forms.IntegerField(
                min_value=low, max_value=high, label=LABELS[name], help_text=HELP[name],
                widget=forms.NumberInput(attrs={"size": 8}))
        self.fields["preferred_batch_sizes"] = forms.CharField(
            required=False, label=LABELS["preferred_batch_sizes"],
            help_text=HELP["preferred_batch_sizes"])
        self.fields["graph_optimization_level"] = forms.ChoiceField(
            choices=GraphOptimizationLevel.choices, label=LABELS["graph_optimization_level"],
            help_text=HELP["graph_optimization_level"])
        self.fields["response_cache"] = forms.BooleanField(
            required=False, label=LABELS["response_cache"], help_text=HELP["response_cache"])

    @classmethod
    def for_version(cls, version, data=None) -> ServingForm:
        initial = {name: getattr(version, name) for name in CONFIG_FIELDS}
        initial["preferred_batch_sizes"] = ", ".join(map(str, version.preferred_batch_sizes))
        initial["graph_optimization_level"] = version.graph_optimization_level
        initial["response_cache"] = version.response_cache
        return cls(data, initial=initial, auto_id="serving-%s")

    def clean_preferred_batch_sizes(self) -> list[int]:
        raw = self.cleaned_data["preferred_batch_sizes"].replace(" ", "")
        try:
            return [int(s) for s in raw.split(",") if s]
        except ValueError:
            raise forms.ValidationError("whole numbers separated by commas, e.g. 4, 8") from None

    def changes(self, version) -> dict:
        """Only the settings this form changes (the audit then names just those)."""
        return {name: value for name, value in self.cleaned_data.items()
                if getattr(version, name) != value}
