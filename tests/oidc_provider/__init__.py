"""A real OpenID provider for the single sign-on specs: django-oauth-toolkit in OIDC mode, in its
own Django project and process (SQLite and an RS256 key in a temp folder). See `server`."""
