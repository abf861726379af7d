"""Configuration errors and YAML loading that name the file, key, value and what was allowed."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration value is missing or out of range; the message says where and why."""

    def __init__(self, path: str | Path | None, key: str, value: Any, allowed: str) -> None:
        self.path = str(path) if path is not None else "<none>"
        self.key = key
        self.value = value
        self.allowed = allowed
        super().__init__(f"{self.path}: {key} = {value!r}: expected {allowed}")


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; raise ConfigError for a missing, unparsable or non-mapping file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(p, "<file>", None, f"a readable file ({exc.strerror})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(p, "<file>", None, f"valid YAML ({exc})") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(p, "<root>", type(data).__name__, "a mapping")
    return data


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes (envelopes, policies and specs are identified by it)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def require(
    data: dict[str, Any], key: str, path: str | Path, kind: type | tuple[type, ...], what: str
) -> Any:
    """Return data[key] if present and of the given type, else raise ConfigError."""
    if key not in data:
        raise ConfigError(path, key, None, f"{what} (key missing)")
    value = data[key]
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise ConfigError(path, key, value, what)
    if not isinstance(value, kind):
        raise ConfigError(path, key, value, what)
    return value


def require_number(
    data: dict[str, Any],
    key: str,
    path: str | Path,
    low: float = float("-inf"),
    high: float = float("inf"),
    unit: str = "",
) -> float:
    """Return a finite number within [low, high] from data[key], else raise ConfigError."""
    value = require(data, key, path, (int, float), f"a number in [{low}, {high}] {unit}".strip())
    v = float(value)
    if not (low <= v <= high):
        raise ConfigError(path, key, value, f"a number in [{low}, {high}] {unit}".strip())
    return v
