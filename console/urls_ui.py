"""The console's pages (the API lives under /api/v1/, serving under /v2/)."""

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.urls import path
from django.views.generic import RedirectView

from .views import (
    audit,
    batch,
    deployment,
    health,
    jobs,
    keys,
    models,
    replicas,
    tokens,
    users,
    versions,
    webhooks,
)

app_name = "console"
M = "models/<str:name>"
urlpatterns = [
    path("", RedirectView.as_view(pattern_name="console:model-list"), name="home"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="console:login"), name="logout"),
    path("models/", models.model_list, name="model-list"),
    path("models/new/", models.model_create, name="model-create"),
    path(f"{M}/", models.model_detail, name="model-detail"),
    path(f"{M}/edit/", models.model_edit, name="model-edit"),
    path(f"{M}/batch/", batch.batch_start, name="batch-start"),
    path(f"{M}/archive/", models.model_archive, {"archived": True}, name="model-archive"),
    path(f"{M}/unarchive/", models.model_archive, {"archived": False}, name="model-unarchive"),
    path(f"{M}/delete/", models.model_delete_view, name="model-delete"),
    path(f"{M}/versions/", models.version_rows, name="version-rows"),
    path(f"{M}/versions/<int:number>/", versions.version_detail, name="version-detail"),
    path(f"{M}/versions/<int:number>/serving/", versions.version_serving,
         name="version-serving"),
    path(f"{M}/versions/<int:number>/delete/", versions.version_delete_view,
         name="version-delete"),
    path(f"{M}/versions/<int:number>/status/", models.version_status, name="version-status"),
    path(f"{M}/versions/<int:number>/tensorrt/", versions.version_tensorrt,
         name="version-tensorrt"),
    path(f"{M}/versions/<int:number>/approval/", versions.version_decide,
         name="version-decide"),
    path(f"{M}/approval/", models.approval_setting, name="approval-setting"),
    path(f"{M}/versions/<int:number>/loadtest/", versions.version_loadtest,
         name="version-loadtest"),
    path(f"{M}/versions/<int:number>/convert/", versions.version_convert_view,
         name="version-convert"),
    path(f"{M}/diff/", models.model_diff, name="model-diff"),
    path(f"{M}/aliases/", models.alias_set, name="alias-set"),
    path(f"{M}/aliases/<str:alias>/remove/", models.alias_remove, name="alias-remove"),
    path(f"{M}/deploy/", models.endpoint_deploy, name="endpoint-deploy"),
    path(f"{M}/deployment/", deployment.deployment_page, name="deployment"),
    path(f"{M}/deployment/charts/", deployment.deployment_charts, name="deployment-charts"),
    path(f"{M}/deployment/live/", deployment.deployment_live, name="deployment-live"),
    # before deployment-action, whose <op> would take "keys"
    path(f"{M}/deployment/keys/", keys.key_create, name="key-create"),
    path(f"{M}/deployment/keys/<str:prefix>/revoke/", keys.key_revoke, name="key-revoke"),
    path(f"{M}/deployment/keys/<str:prefix>/limits/", keys.limits_update, name="key-limits"),
    path(f"{M}/deployment/limits/", keys.limits_update, name="limits"),
    path(f"{M}/deployment/scale-to-zero/", keys.scale_to_zero_update, name="scale-to-zero"),
    path(f"{M}/deployment/protect/", keys.endpoint_protect, name="endpoint-protect"),
    path(f"{M}/deployment/open/", keys.endpoint_open, name="endpoint-open"),
    path(f"{M}/deployment/<str:op>/", deployment.deployment_action, name="deployment-action"),
    path("jobs/", jobs.job_list, name="job-list"),
    path("jobs/<uuid:job_id>/", jobs.job_detail, name="job-detail"),
    path("jobs/<uuid:job_id>/cancel/", jobs.job_cancel, name="job-cancel"),
    path("tokens/", tokens.token_page, name="tokens"),
    path("replicas/", replicas.replicas_page, name="replicas"),
    path("replicas/credentials/<str:prefix>/revoke/", replicas.credential_revoke_view,
         name="replica-credential-revoke"),
    path("tokens/<str:token_key>/revoke/", tokens.token_revoke, name="token-revoke"),
    path("users/", users.user_page, name="users"),
    path("users/<str:username>/role/", users.user_role, name="user-role"),
    path("users/<str:username>/deactivate/", users.user_active, {"active": False},
         name="user-deactivate"),
    path("users/<str:username>/reactivate/", users.user_active, {"active": True},
         name="user-reactivate"),
    path("users/<str:username>/password/", users.user_password, name="user-password"),
    path("webhooks/", webhooks.webhook_page, name="webhooks"),
    path("webhooks/<int:pk>/", webhooks.webhook_detail, name="webhook-detail"),
    path("webhooks/<int:pk>/enable/", webhooks.webhook_active, {"active": True},
         name="webhook-enable"),
    path("webhooks/<int:pk>/disable/", webhooks.webhook_active, {"active": False},
         name="webhook-disable"),
    path("webhooks/<int:pk>/test/", webhooks.webhook_test, name="webhook-test"),
    path("webhooks/<int:pk>/delete/", webhooks.webhook_delete, name="webhook-delete"),
    path("health/", health.health_partial, name="health"),
    path("audit/", audit.audit_list, name="audit-list"),
    path("audit/export.csv", audit.audit_csv, name="audit-csv"),
]

if settings.SSO_ENABLED:  # no single sign-on URLs unless an issuer is configured
    from .sso.views import SsoCallbackView, SsoStartView

    urlpatterns += [
        path("login/sso/", SsoStartView.as_view(), name="sso-start"),
        path("login/sso/callback/", SsoCallbackView.as_view(), name="sso-callback"),
    ]
