from rest_framework.pagination import PageNumberPagination

from registry.errors import InvalidRequest


def _whole(raw: str, name: str, maximum: int | None) -> int:
    """A query parameter that must be a whole number from 1 (to `maximum`): else a 400."""
    bound = f" to {maximum}" if maximum else ""
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1 or (maximum and value > maximum):
        raise InvalidRequest(f"{name} must be a whole number from 1{bound}, not {raw!r}",
                             field=name)
    return value


class Pagination(PageNumberPagination):
    """Page-number pagination that refuses a malformed `page` or `page_size` (DRF would quietly
    use the default size, or cap it) instead of answering something the client did not ask for;
    a page past the last one stays a 404."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
    invalid_page_message = "page {page_number}: {message}"

    def get_page_size(self, request):
        raw = request.query_params.get(self.page_size_query_param, "")
        if raw == "":
            return self.page_size
        return _whole(raw, self.page_size_query_param, self.max_page_size)

    def get_page_number(self, request, paginator):
        raw = request.query_params.get(self.page_query_param, "")
        if raw == "":
            return 1
        if raw in self.last_page_strings:
            return paginator.num_pages
        return _whole(raw, self.page_query_param, None)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"]["minimum"] = 1
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"]["maximum"] = self.max_page_size
        return parameters
