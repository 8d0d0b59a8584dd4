"""Every mutation of the registry is one function here: atomic, row-locked where two requests
can race, audited in the same transaction, and announced to serving after commit."""

from registry.services.access import (
    api_key_create,
    api_key_revoke,
    endpoint_open,
    endpoint_protect,
    ensure_roles,
    token_create,
    token_login,
    token_revoke,
)
from registry.services.approvals import version_approve, version_reject
from registry.services.catalog import (
    alias_remove,
    alias_set,
    model_archive,
    model_create,
    model_update,
)
from registry.services.deletion import model_delete, version_delete
from registry.services.deployments import endpoint_deploy, endpoint_for_update, endpoint_state
from registry.services.limits import limits_set
from registry.services.rollouts import (
    analysis_advance,
    analysis_hold,
    analysis_pause,
    analysis_resume,
    bluegreen_deploy,
    bluegreen_finish,
    bluegreen_switch,
    bluegreen_switch_back,
    canary_abort,
    canary_promote,
    canary_start,
    canary_weight,
    rollback,
    shadow_start,
    shadow_stop,
)
from registry.services.scaling import scale_to_zero_set
from registry.services.sso import role_from_groups, sso_sign_in
from registry.services.versions import version_configure, version_describe, version_upload

__all__ = [
    "analysis_advance", "analysis_hold", "analysis_pause", "analysis_resume", "bluegreen_deploy",
    "bluegreen_finish", "bluegreen_switch", "bluegreen_switch_back", "canary_abort",
    "canary_promote", "canary_start", "canary_weight", "endpoint_state", "rollback",
    "shadow_start", "shadow_stop",
    "alias_remove", "alias_set", "api_key_create", "api_key_revoke", "endpoint_deploy",
    "endpoint_for_update", "endpoint_open", "endpoint_protect", "ensure_roles", "limits_set",
    "model_archive", "model_create", "model_update", "scale_to_zero_set",
    "role_from_groups", "sso_sign_in", "token_create", "token_login", "token_revoke",
    "version_approve", "version_configure", "version_describe", "version_reject",
    "version_upload", "model_delete", "version_delete",
]
