"""Settings shared by every part: keyword first, then ``STEPLENS_*`` environment, then default.

A bad keyword raises ``ValueError``; a bad environment value logs a warning and the default
is used (a typo in a training job's environment must not stop the job).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("steplens")
T = TypeVar("T")

DEFAULT_KAFKA_BOOTSTRAP = "127.0.0.1:19092"


def env_value(name: str, parse: Callable[[str], T], default: T) -> T:
    """Read ``name`` from the environment, parse it, or warn and fall back to ``default``."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return parse(raw)
    except (TypeError, ValueError) as exc:
        log.warning("steplens: ignoring %s=%r (%s); using %r", name, raw, exc, default)
        return default


def setting(
    name: str, value: Any, parse: Callable[[str], T], default: T, check: Callable[[T], bool]
) -> T:
    """Resolve one setting. ``name`` is the keyword; its variable is STEPLENS_<NAME>."""
    if value is not None:
        if not check(value):
            raise ValueError(f"steplens: invalid {name}={value!r}")
        return value
    resolved = env_value(f"STEPLENS_{name.upper()}", parse, default)
    if not check(resolved):
        log.warning("steplens: ignoring STEPLENS_%s=%r; using %r", name.upper(), resolved, default)
        return default
    return resolved


def parse_bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected a boolean (1/0, true/false)")


def kafka_bootstrap(value: str | None = None) -> str:
    return setting("kafka_bootstrap", value, str, DEFAULT_KAFKA_BOOTSTRAP, bool)


def kafka_security_config() -> dict[str, str]:
    """librdkafka security settings from ``STEPLENS_KAFKA_<PROPERTY>`` variables.

    ``STEPLENS_KAFKA_SECURITY_PROTOCOL=SASL_SSL`` becomes ``security.protocol``, and so on for
    ``sasl.*`` and ``ssl.*`` properties. Values are never logged.
    """
    out: dict[str, str] = {}
    for key, value in os.environ.items():
        if not key.startswith("STEPLENS_KAFKA_") or key == "STEPLENS_KAFKA_BOOTSTRAP":
            continue
        prop = key[len("STEPLENS_KAFKA_") :].lower().replace("_", ".")
        if prop.startswith(("security.", "sasl.", "ssl.")):
            out[prop] = value
    return out
