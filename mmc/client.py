"""`mmc.Client`: the REST API as Python methods, for CI jobs and notebooks (what the `mmc` CLI is
built on). One class, its methods grouped by concept in the modules it is made of."""

from __future__ import annotations

from mmc.access import Access
from mmc.as_code import AsCode
from mmc.capture import Capture
from mmc.catalog import Catalog
from mmc.drift import Drift
from mmc.integrations import Integrations
from mmc.jobs import Jobs
from mmc.quality import Quality
from mmc.rollouts import Rollouts
from mmc.teams import Teams


class Client(Catalog, Rollouts, Jobs, Integrations, Access, AsCode, Quality, Capture,
             Drift, Teams):
    """A connection to one console's API with one token.

        with Client() as c:                     # MMC_URL/MMC_TOKEN, else `mmc login`'s
            v = c.upload("fraud", "model.onnx", metrics={"auc": 0.91})
            v = c.wait_validated("fraud", v.number)
            c.canary("fraud", v.number, weight=10, wait=30)

    Every answer is a small frozen dataclass (`.raw` holds the whole payload); every refusal an
    `mmc.MmcError` subclass carrying the server's message.
    """
