"""Where a replica learns what to serve: a model repository folder, or the control plane over HTTP
(the replica API). The registry's in-process source lives in registry/serving_source.py."""
