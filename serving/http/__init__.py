"""The HTTP transport: the ASGI app (KServe v2 REST, SageMaker /ping and /invocations, /metrics),
its JSON and binary-tensor codec, and the hardened httptools protocol uvicorn runs."""
