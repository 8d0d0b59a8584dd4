"""People: create a user with a role, change the role, deactivate or reactivate, reset a password.
The last active admin stays an active admin, so someone can always manage the rest."""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import Q

from registry.audit import Actor, record
from registry.errors import InvalidRequest, LifecycleError, NotFound
from registry.roles import ROLES, role_of

#: Generated passwords: 16 URL-safe characters (96 bits), shown once.
GENERATED_PASSWORD_BYTES = 12


def generate_password() -> str:
    return secrets.token_urlsafe(GENERATED_PASSWORD_BYTES)


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise InvalidRequest(f"role must be one of {', '.join(ROLES)}", field="role")


def _locked(username: str):
    user = (get_user_model().objects.select_for_update().filter(username=username).first())
    if user is None:
        raise NotFound(f"no user {username!r}", field="username")
    return user


def _active_admins():
    """Every active user whose role is admin: superusers and the admin group."""
    return get_user_model().objects.filter(is_active=True).filter(
        Q(is_superuser=True) | Q(groups__name="admin")).distinct()


def _keep_an_admin(user, what: str) -> None:
    """Refuse (409) to take the admin role from the last active admin."""
    if role_of(user) != "admin":
        return
    # Lock the other active admins' rows: two admins demoting each other at once cannot both
    # pass (no FOR UPDATE with DISTINCT on PostgreSQL, hence the two steps).
    ids = list(_active_admins().exclude(pk=user.pk).values_list("pk", flat=True))
    others = list(get_user_model().objects.select_for_update().filter(pk__in=ids, is_active=True)
                  .values_list("pk", flat=True))
    if not others:
        raise LifecycleError(f"{user.get_username()!r} is the last active admin: {what} would "
                             "leave no one to manage users; make another user admin first",
                             field="username")


def _assign(user, role: str) -> None:
    user.groups.remove(*Group.objects.filter(name__in=ROLES))
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    user.__dict__.pop("_mmc_role", None)  # registry.roles caches the role on the instance


def user_create(*, username: str, role: str, actor: Actor, email: str = "",
                password: str = "") -> tuple:
    """A new active user with one role. Without `password` one is generated and returned (shown
    once); with one, it must pass the password validators. Returns (user, generated or "")."""
    _check_role(role)
    username = username.strip()
    if not username or len(username) > 150:
        raise InvalidRequest("username must be 1-150 characters", field="username")
    User = get_user_model()
    try:
        User.username_validator(username)
    except ValidationError as exc:
        raise InvalidRequest(" ".join(exc.messages), field="username") from None
    if email:
        try:
            validate_email(email)
        except ValidationError:
            raise InvalidRequest("enter a valid email address", field="email") from None
    generated = "" if password else generate_password()
    try:
        validate_password(password or generated, User(username=username, email=email))
    except ValidationError as exc:
        raise InvalidRequest(" ".join(exc.messages), field="password") from None
    with transaction.atomic():
        if User.objects.filter(username=username).exists():
            raise LifecycleError(f"user {username!r} already exists", field="username")
        user = User.objects.create_user(username=username, email=email,
                                        password=password or generated)
        _assign(user, role)
        record(actor, "user.create", target_type="user", target=username,
               after={"email": email, "role": role, "password": "generated" if generated
                      else "given"})
    return user, generated


def user_set_role(*, username: str, role: str, actor: Actor):
    _check_role(role)
    with transaction.atomic():
        user = _locked(username)
        before = role_of(user)
        if user.is_superuser and role != "admin":
            raise LifecycleError(f"{username!r} is a superuser (always admin): change that in "
                                 "Django admin", field="role")
        if before == role:
            return user
        if role != "admin":
            _keep_an_admin(user, "demoting it")
        _assign(user, role)
        record(actor, "user.role", target_type="user", target=username,
               before={"role": before}, after={"role": role})
    return user


def user_set_active(*, username: str, active: bool, actor: Actor):
    """Deactivate (its session and every API token stop working at once: both check
    is_active on each request) or reactivate a user."""
    with transaction.atomic():
        user = _locked(username)
        if user.is_active == active:
            return user
        if not active:
            _keep_an_admin(user, "deactivating it")
        user.is_active = active
        user.save(update_fields=["is_active"])
        record(actor, "user.activate" if active else "user.deactivate", target_type="user",
               target=username, before={"active": not active}, after={"active": active})
    return user


def user_reset_password(*, username: str, actor: Actor) -> str:
    """Set a generated password and return it (shown once); audited without the password."""
    password = generate_password()
    with transaction.atomic():
        user = _locked(username)
        user.set_password(password)
        user.save(update_fields=["password"])
        record(actor, "user.password_reset", target_type="user", target=username)
    return password


def user_update(*, username: str, actor: Actor, role: str | None = None,
                active: bool | None = None):
    """The API's PATCH: role and/or active state, both or neither."""
    with transaction.atomic():
        user = None
        if role is not None:
            user = user_set_role(username=username, role=role, actor=actor)
        if active is not None:
            user = user_set_active(username=username, active=active, actor=actor)
    return user
