"""The protocol core: the data plane (routing a request to a loaded version), dynamic batching, the
onnxruntime runtime, desired state and its reconciler, statistics, the response cache, rate
limits, pipelines. No transport, no process model, no Django."""
