"""Ray's token authentication as our processes find and use it (actors/ray_auth.py).

Ray caches the token and the mode once per process, so each case runs in a fresh one, with
the environment a user would have (RAY_AUTH_MODE unset unless the case sets it).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def fresh(code: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
                                                             "RAY_ADDRESS")}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**base, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", **env})


HEADERS = "import json; from actors.ray_auth import http_headers; print(json.dumps(http_headers()))"


def test_the_token_is_sent_from_where_ray_keeps_it_unless_the_user_disabled_authentication(tmp_path):
    token = tmp_path / "token"
    token.write_text("a" * 32)
    found = fresh(HEADERS, RAY_AUTH_TOKEN_PATH=str(token))
    assert json.loads(found.stdout) == {"authorization": "Bearer " + "a" * 32}, found.stderr[-2000:]
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("b" * 32)
    assert json.loads(fresh(HEADERS, HOME=str(home)).stdout) == {"authorization": "Bearer " + "b" * 32}
    assert json.loads(fresh(HEADERS, HOME=str(home), RAY_AUTH_MODE="disabled").stdout) == {}
    assert json.loads(fresh(HEADERS, HOME=str(tmp_path)).stdout) == {}, "no token anywhere: nothing to send"


def test_a_local_cluster_starts_with_token_authentication_and_without_rays_warning(tmp_path):
    started = fresh("import os, ray\nfrom actors.topology import start_cluster\n"
                    "start_cluster({'address': 'local', 'num_cpus': 1, 'num_gpus': 0})\n"
                    "print(os.environ['RAY_AUTH_MODE'])\nray.shutdown()\n")
    assert started.returncode == 0, started.stderr[-3000:]
    assert started.stdout.split() == ["token"] and "Token authentication" not in started.stderr, started.stderr[-3000:]
