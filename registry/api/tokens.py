"""A user's own API tokens: a password login that answers with a token (`mmc login`), and the
revocation of the token a request came with (`mmc logout`). Creating and revoking tokens for
others is the admins' (views.TokenListView)."""

from __future__ import annotations

from axes.helpers import get_client_ip_address
from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

from registry import services
from registry.api.parsers import JSONParser
from registry.api.serializers import (
    TokenCreatedSerializer,
    TokenLoginSerializer,
    TokenSerializer,
)
from registry.api.views import actor, valid
from registry.errors import InvalidRequest
from registry.models import ApiToken


class TokenLoginThrottle(SimpleRateThrottle):
    """Password logins per client address (the address axes locks, not a header a client can
    forge), at settings.TOKEN_LOGIN_RATE: wrong passwords lock the user name (axes); this bounds
    how many tokens one address can mint with right ones."""

    scope = "token-login"

    def get_rate(self) -> str:
        return settings.TOKEN_LOGIN_RATE

    def get_cache_key(self, request, view) -> str:
        return self.cache_format % {"scope": self.scope,
                                    "ident": get_client_ip_address(request._request) or ""}


class TokenLoginView(APIView):
    authentication_classes: list = []  # the password is the credential; a stale token is not
    permission_classes = [AllowAny]
    throttle_classes = [TokenLoginThrottle]
    parser_classes = [JSONParser]

    @extend_schema(request=TokenLoginSerializer, responses={201: TokenCreatedSerializer})
    def post(self, request):
        """Log in with a user name and password; answers a new API token named `client`, valid
        for MMC_TOKEN_TTL_DAYS, shown once. Failures count towards the login lockout (429)."""
        data = valid(TokenLoginSerializer, request.data)
        token, raw = services.token_login(request=request._request, username=data["username"],
                                          password=data["password"], client=data["client"])
        return Response({**TokenSerializer(token).data, "token": raw},
                        status=status.HTTP_201_CREATED)


class TokenLogoutView(APIView):
    permission_classes = [IsAuthenticated]  # any role may end its own token

    @extend_schema(request=None, responses={204: None})
    def post(self, request):
        """Revoke the API token this request is authenticated with."""
        token = request.auth
        if not isinstance(token, ApiToken):
            raise InvalidRequest("this request did not come with an API token")
        services.token_revoke(token_key=token.token_key, actor=actor(request))
        return Response(status=status.HTTP_204_NO_CONTENT)
