"""Versioned policy registry: content hashes, metadata, a known-good pointer, promote, rollback.

Layout of a registry root (default `$SIM2REAL_POLICY_REGISTRY`, else
`~/.local/share/sim2real_ros/policies`):

    index.json               versions, their sha256 and metadata, the known-good pointer
    versions/0001/policy.pt  one file per version (never rewritten)
    log.jsonl                one JSON line per event: add, promote, rollback, node_rollback

Every load re-hashes the file and refuses one whose sha256 differs from its record
(`PolicyIntegrityError`, which names the file, both hashes and the version). Writers take an
exclusive `flock` on `.lock` and replace index.json atomically, so a node and the CLI can share
one registry. A new root is initialised from the shipped default policy (version 1, known-good).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sim2real_ros.config import ConfigError
from sim2real_ros.policy.model import EnsemblePolicy

INDEX_FORMAT = "sim2real_policy_registry/1"
ENV_VAR = "SIM2REAL_POLICY_REGISTRY"
DEFAULT_DIR = Path(__file__).resolve().parent / "default"
POLICY_FILE = "policy.pt"


class PolicyIntegrityError(ConfigError):
    """A policy file's content does not match the sha256 its registry recorded."""


@dataclass
class VersionRecord:
    """One registered policy version."""

    version: int
    file: str  # relative to the registry root
    sha256: str
    created_utc: str
    parent: int | None
    metadata: dict[str, Any] = field(default_factory=dict)


def default_root() -> Path:
    """Return the registry root from the environment or the per-user default."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".local" / "share" / "sim2real_ros" / "policies"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class PolicyRegistry:
    """A directory of policy versions with integrity checks and a known-good pointer."""

    def __init__(self, root: str | Path | None = None, init_from_default: bool = True) -> None:
        self.root = Path(root).expanduser() if root is not None else default_root()
        self.index_path = self.root / "index.json"
        self.log_path = self.root / "log.jsonl"
        if not self.index_path.exists():
            self._initialise(init_from_default)

    # --- storage ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _read_index(self) -> dict[str, Any]:
        try:
            data = json.loads(self.index_path.read_text())
        except OSError as exc:
            raise ConfigError(self.index_path, "<file>", None, f"a readable file ({exc})") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(self.index_path, "<file>", None, f"valid JSON ({exc})") from exc
        if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT:
            raise ConfigError(self.index_path, "format", data.get("format") if isinstance(
                data, dict) else None, INDEX_FORMAT)
        return data

    def _write_index(self, data: dict[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".index.", suffix=".json")
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, self.index_path)

    def _initialise(self, from_default: bool) -> None:
        with self._locked():
            if self.index_path.exists():  # another process got there first
                return
            self._write_index(
                {"format": INDEX_FORMAT, "known_good": None, "known_good_history": [],
                 "versions": {}}
            )
        default_file = DEFAULT_DIR / POLICY_FILE
        if from_default and default_file.is_file():
            meta_path = DEFAULT_DIR / "metadata.json"
            meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
            meta = {**meta, "source": "shipped default"}
            self._add_bytes(default_file.read_bytes(), meta, parent=None)
            self.promote(1, reason="initialised from the shipped default policy")

    def log_event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append one event to log.jsonl and return it."""
        event = {"t_utc": _utc_now(), "t_unix_s": time.time(), "event": kind, **fields}
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as fh:
            fh.write(json.dumps(event, sort_keys=True) + "\n")
        return event

    def events(self) -> list[dict[str, Any]]:
        """Return every logged event, oldest first."""
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line]

    # --- queries ---------------------------------------------------------------------------

    def versions(self) -> list[VersionRecord]:
        """Return all versions, oldest first."""
        data = self._read_index()
        return [VersionRecord(**rec) for _, rec in sorted(
            data["versions"].items(), key=lambda kv: int(kv[0]))]

    @property
    def known_good(self) -> int | None:
        """The known-good version number, or None in an empty registry."""
        kg = self._read_index()["known_good"]
        return None if kg is None else int(kg)

    def known_good_history(self) -> list[int]:
        """Versions promoted to known-good, oldest first (rollback walks back through it)."""
        return [int(v) for v in self._read_index()["known_good_history"]]

    def resolve(self, version: int) -> int:
        """Map 0 to the known-good version; check that the version exists."""
        data = self._read_index()
        if version == 0:
            if data["known_good"] is None:
                raise ConfigError(self.index_path, "known_good", None,
                                  "a known-good version (the registry is empty: train or add one)")
            version = int(data["known_good"])
        if str(version) not in data["versions"]:
            known = sorted(int(v) for v in data["versions"])
            raise ConfigError(self.index_path, "version", version,
                              f"one of {known} (or 0 = known-good)")
        return version

    def record(self, version: int = 0) -> VersionRecord:
        """Return the record of a version (0 = known-good)."""
        v = self.resolve(version)
        return VersionRecord(**self._read_index()["versions"][str(v)])

    def path_of(self, version: int = 0) -> Path:
        """Return the policy file of a version."""
        return self.root / self.record(version).file

    def read_verified(self, version: int = 0) -> tuple[bytes, VersionRecord]:
        """Return a version's file bytes after checking them against the recorded sha256."""
        rec = self.record(version)
        path = self.root / rec.file
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise PolicyIntegrityError(
                path, "file", None, f"the file of version {rec.version} ({exc.strerror})"
            ) from exc
        actual = _sha256(data)
        if actual != rec.sha256:
            raise PolicyIntegrityError(
                path, "sha256", actual,
                f"{rec.sha256} as recorded for version {rec.version} in {self.index_path}; "
                "the file was modified or corrupted, refusing to load it",
            )
        return data, rec

    def verify(self, version: int = 0) -> VersionRecord:
        """Check a version's file hash; raise PolicyIntegrityError on mismatch."""
        return self.read_verified(version)[1]

    def load(self, version: int = 0) -> tuple[EnsemblePolicy, VersionRecord]:
        """Load a verified policy (0 = known-good)."""
        data, rec = self.read_verified(version)
        policy = EnsemblePolicy.from_bytes(data, str(self.root / rec.file))
        return policy, rec

    # --- changes ---------------------------------------------------------------------------

    def _add_bytes(
        self, blob: bytes, metadata: dict[str, Any], parent: int | None
    ) -> VersionRecord:
        with self._locked():
            data = self._read_index()
            if parent is not None and str(parent) not in data["versions"]:
                known = sorted(int(v) for v in data["versions"])
                raise ConfigError(self.index_path, "parent", parent,
                                  f"an existing version {known}")
            version = 1 + max((int(v) for v in data["versions"]), default=0)
            rel = f"versions/{version:04d}/{POLICY_FILE}"
            dest = self.root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_suffix(".tmp")
            tmp.write_bytes(blob)
            os.replace(tmp, dest)
            os.chmod(dest, 0o444)  # versions are immutable; a changed file is refused anyway
            rec = VersionRecord(version, rel, _sha256(blob), _utc_now(), parent, dict(metadata))
            data["versions"][str(version)] = asdict(rec)
            self._write_index(data)
        self.log_event("add", version=version, sha256=rec.sha256, parent=parent)
        return rec

    def add(
        self, policy: EnsemblePolicy, metadata: dict[str, Any] | None = None,
        parent: int | None = None,
    ) -> VersionRecord:
        """Register a new version of a policy; return its record (not promoted)."""
        meta = {**policy.metadata, **(metadata or {})}
        policy.metadata = meta
        return self._add_bytes(policy.to_bytes(), meta, parent)

    def add_file(
        self, path: str | Path, metadata: dict[str, Any] | None = None, parent: int | None = None
    ) -> VersionRecord:
        """Register an existing policy file (it must load) as a new version."""
        blob = Path(path).read_bytes()
        EnsemblePolicy.from_bytes(blob, str(path))
        return self._add_bytes(blob, dict(metadata or {}), parent)

    def promote(self, version: int, reason: str = "") -> VersionRecord:
        """Make a verified version the known-good one."""
        rec = self.verify(version)
        with self._locked():
            data = self._read_index()
            previous = data["known_good"]
            data["known_good"] = rec.version
            hist = [int(v) for v in data["known_good_history"]]
            if not hist or hist[-1] != rec.version:
                hist.append(rec.version)
            data["known_good_history"] = hist
            self._write_index(data)
        self.log_event("promote", version=rec.version, previous=previous, reason=reason)
        return rec

    def rollback(self, reason: str) -> VersionRecord:
        """Move the known-good pointer back to the previously promoted version."""
        with self._locked():
            data = self._read_index()
            hist = [int(v) for v in data["known_good_history"]]
            if len(hist) < 2:
                raise ConfigError(self.index_path, "known_good_history", hist,
                                  "at least two promoted versions to roll back")
            current = hist.pop()
            target = hist[-1]
            self._check_hash(data, target)
            data["known_good"] = target
            data["known_good_history"] = hist
            self._write_index(data)
        self.log_event("rollback", version=target, previous=current, reason=reason)
        return VersionRecord(**data["versions"][str(target)])

    def _check_hash(self, data: dict[str, Any], version: int) -> None:
        rec = VersionRecord(**data["versions"][str(version)])
        path = self.root / rec.file
        actual = _sha256(path.read_bytes()) if path.is_file() else "<missing>"
        if actual != rec.sha256:
            raise PolicyIntegrityError(path, "sha256", actual,
                                       f"{rec.sha256} as recorded for version {version}")

    def export(self, version: int, dest: str | Path) -> Path:
        """Copy a verified version's file to `dest`."""
        data, _ = self.read_verified(version)
        d = Path(dest)
        d.parent.mkdir(parents=True, exist_ok=True)
        d.write_bytes(data)
        return d

    def copy_to(self, dest_root: str | Path) -> PolicyRegistry:
        """Copy the whole registry to a new root (tests and experiments use a private copy)."""
        shutil.copytree(self.root, dest_root)
        return PolicyRegistry(dest_root, init_from_default=False)
