"""The servers grpoflow starts and the services it talks to.

A server grpoflow starts (`grpoflow serve`, `grpoflow ui`) answers beyond this machine only with
authentication on: `require_auth_beyond_loopback` refuses any other bind address, in one line naming how to turn it on.
"""

from __future__ import annotations

import ipaddress

from components.common.errors import ConfigError


def is_loopback(host: str) -> bool:
    """True when a server bound to `host` answers this machine only.

    >>> [is_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "", "10.0.0.5", "myhost")]
    [True, True, True, False, False, False, False]
    """
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "" (every interface) or a name that may resolve to anything


def require_auth_beyond_loopback(host: str, authenticated: bool, how: str) -> None:
    """Refuse to bind a server beyond loopback without authentication; `how` says how to turn it on.
    Loopback needs none."""
    if not authenticated and not is_loopback(host):
        raise ConfigError(f"--host {host or '(every interface)'} is reachable from the network: {how}, "
                          "or bind to 127.0.0.1")
