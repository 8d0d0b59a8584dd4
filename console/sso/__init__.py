"""Single sign-on with an OpenID Connect provider (mozilla-django-oidc), beside the password form.

`provider` reads the issuer's discovery document and signing keys; `backend` checks the ID token
and hands the claims to registry.services.sso_sign_in; `views` start and finish the
authorization-code flow (PKCE S256, state, nonce). Off unless MMC_OIDC_ISSUER is set."""
