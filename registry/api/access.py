"""API tokens and users. Anyone with a role manages their own tokens; admins everyone's, and
users (so CI can provision people)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import selectors
from registry.api.parsers import JSONParser
from registry.api.serializers import (
    TokenCreatedSerializer,
    TokenCreateSerializer,
    TokenSerializer,
    UserCreatedSerializer,
    UserCreateSerializer,
    UserSerializer,
    UserUpdateSerializer,
)
from registry.api.throttles import TokenCreateThrottle
from registry.audit import Actor
from registry.errors import InvalidRequest
from registry.models import ApiToken
from registry.roles import has_role, role_of
from registry.services import access, users


def _valid(serializer_class, data) -> dict:
    ser = serializer_class(data=data)
    ser.is_valid(raise_exception=True)
    return ser.validated_data


class TokenListView(generics.ListAPIView):
    """Your own tokens (an admin: everyone's); create one (for another user: admins only)."""

    read_role = write_role = "viewer"
    serializer_class = TokenSerializer
    parser_classes = [JSONParser]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ApiToken.objects.none()
        user = self.request.user
        return selectors.token_list(user=None if has_role(user, "admin") else user)

    def get_throttles(self):
        extra = [TokenCreateThrottle()] if self.request.method == "POST" else []
        return [*super().get_throttles(), *extra]

    @extend_schema(request=TokenCreateSerializer, responses={201: TokenCreatedSerializer})
    def post(self, request):
        """Create a named token (for yourself unless an admin names `user`); shown once. It acts
        with its user's role, never more; `read_only` limits it to reads."""
        data = _valid(TokenCreateSerializer, request.data)
        username = data.get("user")
        if username is not None and not has_role(request.user, "admin"):
            raise PermissionDenied("naming another `user` needs the admin role; leave `user` out "
                                   "to create a token for yourself")
        token, raw = access.token_create(
            username=username or request.user.get_username(), name=data["name"],
            expires_in_days=data["expires_in_days"], read_only=data["read_only"],
            actor=Actor.from_request(request))
        return Response({**TokenSerializer(token).data, "token": raw},
                        status=status.HTTP_201_CREATED)


class TokenDetailView(APIView):
    read_role = write_role = "viewer"

    @extend_schema(responses={204: None})
    def delete(self, request, token_key):
        """Revoke a token: your own, or (admins) anyone's."""
        owner = None if has_role(request.user, "admin") else request.user
        access.token_revoke(token_key=token_key, owner=owner, actor=Actor.from_request(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


def user_row(user) -> dict:
    return {"username": user.get_username(), "email": user.email, "role": role_of(user),
            "is_active": user.is_active, "is_superuser": user.is_superuser,
            "date_joined": user.date_joined, "last_login": user.last_login,
            "token_count": getattr(user, "token_count", 0)}


def _row_of(username: str) -> dict:
    return UserSerializer(user_row(selectors.user_get(username))).data


class UserListView(generics.ListAPIView):
    read_role = write_role = "admin"
    serializer_class = UserSerializer
    parser_classes = [JSONParser]

    def get_queryset(self):
        return selectors.user_list()

    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(UserSerializer([user_row(u) for u in page],
                                                          many=True).data)

    @extend_schema(request=UserCreateSerializer, responses={201: UserCreatedSerializer})
    def post(self, request):
        """Create an active user with a role; without `password` one is generated and returned
        once."""
        data = _valid(UserCreateSerializer, request.data)
        user, generated = users.user_create(actor=Actor.from_request(request), **data)
        return Response({**_row_of(user.get_username()), "password": generated or None},
                        status=status.HTTP_201_CREATED)


class UserDetailView(APIView):
    read_role = write_role = "admin"
    parser_classes = [JSONParser]

    @extend_schema(responses=UserSerializer)
    def get(self, request, username):
        return Response(_row_of(username))

    @extend_schema(request=UserUpdateSerializer, responses=UserSerializer)
    def patch(self, request, username):
        """Set the role and/or deactivate (every token and session stops working at once) or
        reactivate. The last active admin cannot lose the role (409)."""
        data = _valid(UserUpdateSerializer, request.data)
        if not data:
            raise InvalidRequest("send `role` and/or `is_active`")
        users.user_update(username=username, role=data.get("role"),
                          active=data.get("is_active"), actor=Actor.from_request(request))
        return Response(_row_of(username))
