"""The one readiness probe every waiter uses (platform, benchmarks, stacks).

Standard library only: the platform and the benchmarks call it in tight loops
and it must not pull in an HTTP client stack.
"""

from __future__ import annotations

import urllib.error
import urllib.request


def probe_ready(base_url: str, timeout: float = 2.0) -> bool:
    """True when ``GET {base_url}/v2/health/ready`` answers 200; never raises."""
    try:
        with urllib.request.urlopen(
            f"{base_url.rstrip('/')}/v2/health/ready", timeout=timeout
        ) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):  # not listening, 503, bad URL
        return False
