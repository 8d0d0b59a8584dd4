from urllib.parse import urlsplit

from csp.constants import UNSAFE_INLINE
from csp.decorators import csp_update
from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.settings import spectacular_settings
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from console.views.health import healthz, healthz_metrics


def swagger_csp(view):
    """The API docs page is Swagger UI, not the console: it may use inline styles, and load
    Swagger UI's files from SWAGGER_UI_DIST's origin should an operator point it at a CDN (by
    default they are our own static files). The split view keeps its script off-page."""
    dist = urlsplit(spectacular_settings.SWAGGER_UI_DIST)
    origin = [f"{dist.scheme}://{dist.netloc}"] if dist.scheme in ("http", "https") else []
    return csp_update({"script-src": origin, "style-src": [*origin, UNSAFE_INLINE],
                       "img-src": [*origin, "data:"]})(view)


urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("healthz/metrics", healthz_metrics, name="healthz-metrics"),
    # browsers ask for /favicon.ico whatever the page links: send them to our own icon
    path("favicon.ico", RedirectView.as_view(url=static("favicon.svg"), permanent=True)),
    path("api/v1/", include("registry.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", swagger_csp(SpectacularSwaggerSplitView.as_view(url_name="schema")),
         name="docs"),
    path("", include("console.urls_ui")),
]

# Errors Django answers itself: JSON under /api/, the console's pages elsewhere.
handler400 = "registry.api.errors.bad_request"
handler403 = "registry.api.errors.permission_denied"
handler404 = "registry.api.errors.page_not_found"
handler500 = "registry.api.errors.server_error"
