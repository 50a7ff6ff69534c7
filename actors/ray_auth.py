"""Ray's token authentication, found the way Ray finds it, for every process of ours that talks to a cluster.

Ray 2.60 turns token authentication on for a cluster that ``ray.init()`` starts, writing a token
to ``~/.ray/auth_token`` if there is none, and for ``ray start --head`` whenever a token exists
(``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``). So one local
``cuda-agent train`` is enough for every head started later on that machine to want the token.
Its Jobs API client, though, sends the token only where ``RAY_AUTH_MODE=token`` is set, and
``ray.init`` says so in a warning on every start. Here:

- ``http_headers``: the token from Ray's own loader, sent to the Jobs API whenever one exists.
  A cluster without token authentication ignores the header (its middleware passes every
  request), and one with it needs it; only ``RAY_AUTH_MODE=disabled`` keeps it back.
- ``settle_mode``: before ``ray.init``, the mode Ray would pick (token for a cluster it
  starts; token for one it joins where a token exists), set without Ray's warning.
- ``auth_failure``: what a refused request means, and the fix, in one line.
"""
from __future__ import annotations

import os

MODE_ENV = "RAY_AUTH_MODE"
TOKEN_SOURCES = "~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN"


def _loader():
    from ray._raylet import AuthenticationTokenLoader

    return AuthenticationTokenLoader.instance()


def has_token() -> bool:
    """Whether a token is where Ray looks for one, whatever the mode."""
    return bool(_loader().has_token(ignore_auth_mode=True))


def http_headers() -> dict[str, str]:
    """The Authorization header for a Jobs API client: the token if one exists and the mode is not disabled."""
    if os.environ.get(MODE_ENV, "").lower() == "disabled":
        return {}
    return dict(_loader().get_token_for_http_header(ignore_auth_mode=True))


def settle_mode(starts_cluster: bool) -> None:
    """Set RAY_AUTH_MODE, unless the user has, to what ray.init would choose, so that it does not warn.

    A cluster ray.init starts gets token authentication (Ray's default, the token written if
    missing); a cluster it joins is taken to use the token when one exists, as Ray does for
    ``address="auto"`` (a Ray job's driver inherits the mode from its head anyway).
    """
    if os.environ.get(MODE_ENV) is not None:
        return
    if starts_cluster or has_token():
        from ray._private.authentication.authentication_token_setup import _enable_token_auth

        _enable_token_auth()  # Ray's own: the variable, and its cached config read again


def token_source() -> str:
    """Where Ray takes the token from: RAY_AUTH_TOKEN first, then the file RAY_AUTH_TOKEN_PATH names, then ~/.ray/auth_token."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return f"RAY_AUTH_TOKEN_PATH={os.environ['RAY_AUTH_TOKEN_PATH']}"
    return "~/.ray/auth_token"


def auth_failure(address: str, err: BaseException) -> str:
    """A one-line explanation of a request the cluster at ``address`` refused for its token, with the fix."""
    text = str(err)
    if os.environ.get(MODE_ENV, "").lower() == "disabled":
        return (f"the Ray cluster at {address} requires its authentication token, and RAY_AUTH_MODE=disabled here "
                f"keeps it from being sent: unset RAY_AUTH_MODE")
    if "Forbidden" in text or text.startswith("Authentication failed"):  # 403: a token, not the cluster's
        return (f"the Ray cluster at {address} refused the authentication token here ({token_source()}): it is "
                f"not the cluster's; copy the head's token here (`ray get-auth-token` on the head prints it) into "
                f"~/.ray/auth_token, or set RAY_AUTH_TOKEN")
    return (f"the Ray cluster at {address} requires an authentication token and there is none here "
            f"({TOKEN_SOURCES}): copy the head's token (`ray get-auth-token` on the head prints it) into "
            f"~/.ray/auth_token, or set RAY_AUTH_TOKEN")
