from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsValidator(OAuth2Validator):
    """ID tokens (and userinfo) carry the user's name, e-mail and groups, as Keycloak's or
    Okta's do once a groups mapper is set up."""

    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "groups": "openid"}

    def get_additional_claims(self, request):
        user = request.user
        return {"preferred_username": user.username, "email": user.email,
                "groups": sorted(user.groups.values_list("name", flat=True))}
