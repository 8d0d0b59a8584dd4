"""Start and finish the authorization-code flow. Whatever goes wrong ends on the login page with
a message that says what happened; the details go to the log."""

from __future__ import annotations

import logging

import requests
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import SuspiciousOperation
from django.shortcuts import redirect
from django.views.generic import View
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from console.sso import provider
from registry.roles import role_of

log = logging.getLogger(__name__)


def back_to_login(request, message: str):
    messages.error(request, message)
    return redirect("console:login")


class SsoStartView(OIDCAuthenticationRequestView):
    """Redirects to the provider's authorization endpoint with state, nonce and a PKCE S256
    challenge kept in the session."""

    def __init__(self, **kwargs):
        View.__init__(self, **kwargs)  # the endpoint comes from discovery, at request time

    OIDC_RP_CLIENT_ID = property(lambda self: settings.OIDC_RP_CLIENT_ID)

    def get(self, request):
        try:
            self.OIDC_OP_AUTH_ENDPOINT = provider.metadata()["authorization_endpoint"]
        except provider.ProviderUnavailable as exc:
            log.warning("single sign-on unavailable: %s", exc)
            return back_to_login(request, f"Single sign-on is unavailable: {exc}. Try again "
                                          "later, or log in with a console password.")
        return super().get(request)


class SsoCallbackView(OIDCAuthenticationCallbackView):
    """The provider sends the browser back here with a code (or an error)."""

    def get(self, request):
        try:
            return super().get(request)
        except SuspiciousOperation as exc:  # unknown state, or an ID token that does not verify
            log.warning("single sign-on refused: %s", exc)
            return back_to_login(request, "Single sign-on failed: the identity provider's "
                                          "answer could not be verified (details are in the "
                                          "console's log). Start again from this page.")
        except requests.HTTPError as exc:
            log.warning("single sign-on: %s", exc)
            status = exc.response.status_code if exc.response is not None else "?"
            return back_to_login(request, "Single sign-on failed: the identity provider refused "
                                          f"the console's token request (HTTP {status}).")
        except (requests.RequestException, provider.ProviderUnavailable) as exc:
            log.warning("single sign-on: provider unreachable: %s", exc)
            return back_to_login(request, "Single sign-on failed: the identity provider could "
                                          "not be reached. Try again later.")

    def login_failure(self):
        request = self.request
        if error := request.GET.get("error"):
            description = request.GET.get("error_description", "")[:200]
            return back_to_login(request, "The identity provider did not sign you in: "
                                          f"{error}{f' ({description})' if description else ''}.")
        reason = getattr(request, "sso_refusal", None) or (
            "Single sign-on did not complete (the sign-in expired or was started in another "
            "browser). Start again from this page.")
        return back_to_login(request, reason)

    def login_success(self):
        response = super().login_success()
        if role_of(self.user) is None:
            messages.warning(self.request, "You are signed in, but none of your identity "
                                           "provider groups maps to a role in this console, so "
                                           "you can open no page yet. Ask a console admin.")
        return response
