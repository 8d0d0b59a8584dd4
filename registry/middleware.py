import uuid


class RequestContextMiddleware:
    """Gives each request an id (X-Request-Id in, or a new one) that audit events carry."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        rid = request.headers.get("X-Request-Id", "")[:64] or uuid.uuid4().hex
        request.request_id = rid
        response = self.get_response(request)
        response["X-Request-Id"] = rid
        return response
