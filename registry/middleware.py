import uuid

from serving.core.logs import REQUEST_ID, keep_trace_ids


class RequestContextMiddleware:
    """Gives each request an id (X-Request-Id in, or a new one) that audit events carry."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        rid = request.headers.get("X-Request-Id", "")[:64] or uuid.uuid4().hex
        request.request_id = rid
        # The request's log lines carry it (MMC_LOG_FORMAT=json), Django's own "Not Found" and
        # error lines too: they are written after this returns, in the request's context.
        REQUEST_ID.set(rid)
        keep_trace_ids()  # while tracing: the span Django's instrumentation began for it
        response = self.get_response(request)
        response["X-Request-Id"] = rid
        return response
