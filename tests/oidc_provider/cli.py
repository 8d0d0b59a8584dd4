"""`python -m tests.oidc_provider.cli [--migrate] '<json>'` (with DJANGO_SETTINGS_MODULE and
OP_* set): creates or updates the provider's clients and users, e.g.
{"clients": [{"client_id": "console", "secret": "s", "redirect_uri": "http://.../callback/"}],
 "users": [{"username": "alice", "password": "pw", "groups": ["ml-eng"]}]}"""

import json
import sys

import django


def apply(spec: dict) -> None:
    from django.contrib.auth.models import Group, User
    from oauth2_provider.models import Application

    for client in spec.get("clients", []):
        algorithm = client.get("algorithm", "RS256")
        Application.objects.filter(client_id=client["client_id"]).delete()
        Application.objects.create(
            name=client.get("name", client["client_id"]), client_id=client["client_id"],
            client_secret=client["secret"], client_type=Application.CLIENT_CONFIDENTIAL,
            authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
            redirect_uris=client["redirect_uri"], algorithm=algorithm,
            hash_client_secret=algorithm != "HS256",  # HS256 signs with the secret itself
            skip_authorization=False)  # the user is asked to consent
    for spec_user in spec.get("users", []):
        user, _ = User.objects.get_or_create(username=spec_user["username"])
        if "password" in spec_user:
            user.set_password(spec_user["password"])
        user.email = spec_user.get("email", f"{user.username}@example.com")
        user.save()
        user.groups.set([Group.objects.get_or_create(name=g)[0]
                         for g in spec_user.get("groups", [])])


def main(argv: list[str]) -> None:
    django.setup()
    if argv[0] == "--migrate":
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        argv = argv[1:]
    apply(json.loads(argv[0]) if argv else {})


if __name__ == "__main__":
    main(sys.argv[1:])
