"""`mmc baseline` and `mmc drift`: a version's baseline (show, or compute from a dataset or a
capture window) and an endpoint's drift thresholds, episodes and latest comparisons."""

from __future__ import annotations

from mmc import Client
from registry.cli.output import print_json

THRESHOLDS = ("psi_threshold", "p_value", "window_minutes", "min_samples")


def cmd_baseline(c: Client, a) -> int:
    """Without options: the stored baseline; with --dataset or --since: compute a new one."""
    if a.dataset or a.since or a.until:
        print_json(c.set_baseline(a.model, a.version, dataset=a.dataset, since=a.since,
                                  until=a.until))
    else:
        print_json(c.get_baseline(a.model, a.version))
    return 0


def cmd_drift(c: Client, a) -> int:
    """Without options: thresholds, episodes and latest points; with any: change those."""
    changes = {k: getattr(a, k) for k in THRESHOLDS if getattr(a, k) is not None}
    print_json(c.set_drift(a.model, **changes) if changes else c.get_drift(a.model))
    return 0


def drift_parsers(sub) -> None:
    s = sub.add_parser("baseline", help="show or compute a version's baseline statistics")
    s.add_argument("model")
    s.add_argument("version", type=int)
    s.add_argument("--dataset", help="an uploaded dataset's id (mmc batch upload)")
    s.add_argument("--since", help="start of the capture window (ISO 8601; default: 1 h ago)")
    s.add_argument("--until", help="end of the capture window (ISO 8601; default: now)")
    s.set_defaults(fn=cmd_baseline)
    s = sub.add_parser("drift", help="show or change the endpoint's drift thresholds")
    s.add_argument("model")
    s.add_argument("--psi-threshold", type=float, help="PSI above which a feature may drift")
    s.add_argument("--p-value", type=float,
                   help="two-sample test p-value (Bonferroni-corrected) below which it may drift")
    s.add_argument("--window-minutes", type=int, help="minutes of recent capture compared")
    s.add_argument("--min-samples", type=int, help="values a feature needs to be compared")
    s.set_defaults(fn=cmd_drift)
