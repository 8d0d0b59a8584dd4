"""Console pages, one module per concept: models, versions, audit (access holds the role check)."""
