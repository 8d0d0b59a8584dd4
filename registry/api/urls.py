from django.urls import path

from registry.api import integrations as ig
from registry.api import jobs as jb
from registry.api import rollouts as ro
from registry.api import views as v

app_name = "api"
M = "models/<str:name>"
urlpatterns = [
    path("me/", v.MeView.as_view(), name="me"),
    path("models/", v.ModelListView.as_view(), name="model-list"),
    path(f"{M}/", v.ModelDetailView.as_view(), name="model-detail"),
    path(f"{M}/archive/", v.ModelArchiveView.as_view(), name="model-archive"),
    path(f"{M}/versions/", v.VersionListView.as_view(), name="version-list"),
    path(f"{M}/versions/upload/", v.VersionRawUploadView.as_view(), name="version-upload-raw"),
    path(f"{M}/versions/<int:number>/", v.VersionDetailView.as_view(), name="version-detail"),
    path(f"{M}/versions/<int:number>/artifact/", v.VersionArtifactView.as_view(),
         name="version-artifact"),
    path(f"{M}/aliases/", v.AliasListView.as_view(), name="alias-list"),
    path(f"{M}/aliases/<str:alias>/", v.AliasDetailView.as_view(), name="alias-detail"),
    path(f"{M}/endpoint/", v.EndpointView.as_view(), name="endpoint"),
    path(f"{M}/endpoint/deploy/", v.EndpointDeployView.as_view(), name="endpoint-deploy"),
    path(f"{M}/endpoint/canary/", ro.CanaryView.as_view(), name="endpoint-canary"),
    path(f"{M}/endpoint/weight/", ro.WeightView.as_view(), name="endpoint-weight"),
    path(f"{M}/endpoint/promote/", ro.PromoteView.as_view(), name="endpoint-promote"),
    path(f"{M}/endpoint/abort/", ro.AbortView.as_view(), name="endpoint-abort"),
    path(f"{M}/endpoint/analysis/pause/", ro.PauseView.as_view(), name="endpoint-pause"),
    path(f"{M}/endpoint/analysis/resume/", ro.ResumeView.as_view(), name="endpoint-resume"),
    path(f"{M}/endpoint/rollback/", ro.RollbackView.as_view(), name="endpoint-rollback"),
    path(f"{M}/endpoint/blue-green/deploy/", ro.BlueGreenDeployView.as_view(),
         name="endpoint-bg-deploy"),
    path(f"{M}/endpoint/blue-green/switch/", ro.SwitchView.as_view(), name="endpoint-switch"),
    path(f"{M}/endpoint/blue-green/switch-back/", ro.SwitchBackView.as_view(),
         name="endpoint-switch-back"),
    path(f"{M}/endpoint/blue-green/finish/", ro.BlueGreenFinishView.as_view(),
         name="endpoint-bg-finish"),
    path(f"{M}/endpoint/shadow/", ro.ShadowView.as_view(), name="endpoint-shadow"),
    path(f"{M}/endpoint/keys/", v.ApiKeyListView.as_view(), name="apikey-list"),
    path(f"{M}/endpoint/keys/<str:prefix>/", v.ApiKeyDetailView.as_view(), name="apikey-detail"),
    path("audit/", v.AuditListView.as_view(), name="audit-list"),
    path("tokens/", v.TokenListView.as_view(), name="token-list"),
    path("tokens/<str:token_key>/", v.TokenDetailView.as_view(), name="token-detail"),
    path("replicas/", v.ReplicaListView.as_view(), name="replica-list"),
    path(f"{M}/async-infer/", jb.AsyncInferView.as_view(), name="async-infer"),
    path(f"{M}/batch/", jb.BatchView.as_view(), name="batch-create"),
    path("datasets/", jb.DatasetListView.as_view(), name="dataset-list"),
    path("datasets/upload/", jb.DatasetUploadView.as_view(), name="dataset-upload-raw"),
    path("datasets/<uuid:dataset_id>/", jb.DatasetDetailView.as_view(), name="dataset-detail"),
    path("jobs/", jb.JobListView.as_view(), name="job-list"),
    path("jobs/<uuid:job_id>/", jb.JobDetailView.as_view(), name="job-detail"),
    path("jobs/<uuid:job_id>/cancel/", jb.JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<uuid:job_id>/result/", jb.JobResultView.as_view(), name="job-result"),
    # Integrations: Triton export, TensorRT builds, webhooks.
    path(f"{M}/export", ig.ModelExportView.as_view(), name="model-export"),
    path(f"{M}/export/", ig.ModelExportView.as_view()),
    path(f"{M}/versions/<int:number>/tensorrt/", ig.VersionTensorRTView.as_view(),
         name="version-tensorrt"),
    path("webhooks/", ig.WebhookListView.as_view(), name="webhook-list"),
    path("webhooks/<int:pk>/", ig.WebhookDetailView.as_view(), name="webhook-detail"),
    path("webhooks/<int:pk>/test/", ig.WebhookTestView.as_view(), name="webhook-test"),
    path("webhooks/<int:pk>/deliveries/", ig.WebhookDeliveryListView.as_view(),
         name="webhook-deliveries"),
]
