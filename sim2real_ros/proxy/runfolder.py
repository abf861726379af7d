"""A resumable run folder: one sub-folder per stage, sealed by a sha256 manifest.

A stage is done when its `manifest.json` exists; the manifest lists every artifact with its
sha256 and size and the manifests of the stages it was computed from. On resume every sealed
stage is re-hashed: a changed, missing or extra-large artifact, or a stage whose upstream was
recomputed since, stops the run with an error that names the file. Nothing is ever silently
reused. A stage folder without a manifest is an interrupted attempt and is cleared and rerun.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim2real_ros.config import ConfigError

MANIFEST = "manifest.json"
RUN_FILE = "run.json"
MANIFEST_FORMAT = "sim2real_transfer_stage/1"


class ArtifactError(ConfigError):
    """A sealed artifact is missing or differs from its manifest; resuming would reuse it."""


def sha256_of(path: Path) -> str:
    """Return the hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_json(path: Path, data: Any) -> Path:
    """Write JSON atomically (temp file + rename) so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True, default=_jsonable)
        fh.write("\n")
    os.replace(tmp, path)
    return path


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def read_json(path: Path) -> Any:
    """Read a JSON file; ConfigError naming the file when it is missing or malformed."""
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(path, "<file>", None, f"a readable file ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(path, "<file>", None, f"valid JSON ({exc.msg})") from exc


@dataclass
class StageRecord:
    """A sealed stage as its manifest describes it."""

    name: str
    files: dict[str, dict[str, Any]]  # relative path -> {"sha256", "bytes"}
    upstream: dict[str, str]  # stage name -> sha256 of its manifest
    meta: dict[str, Any]
    manifest_sha256: str


class RunFolder:
    """The folder of one experiment run."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    # ---- run-level --------------------------------------------------------------------------
    @property
    def run_file(self) -> Path:
        """Path of run.json (configuration, seeds, versions)."""
        return self.root / RUN_FILE

    def create(self, run_info: dict[str, Any]) -> None:
        """Start a new run; refuse a folder that already holds one (never overwrite a run)."""
        if self.run_file.exists():
            raise ConfigError(self.run_file, "<file>", "exists",
                              "a new run folder (pass --resume to continue this run)")
        if self.root.exists() and any(self.root.iterdir()):
            raise ConfigError(self.root, "<folder>", "not empty",
                              "an empty or new folder for a new run")
        self.root.mkdir(parents=True, exist_ok=True)
        write_json(self.run_file, run_info)

    def load_run(self) -> dict[str, Any]:
        """Return run.json; ConfigError when there is no run to resume."""
        if not self.run_file.exists():
            raise ConfigError(self.run_file, "<file>", None,
                              "an existing run to resume (run without --resume to start one)")
        data = read_json(self.run_file)
        if not isinstance(data, dict):
            raise ConfigError(self.run_file, "<root>", type(data).__name__, "a JSON object")
        return data

    # ---- stages -----------------------------------------------------------------------------
    def stage_dir(self, name: str) -> Path:
        """Folder of one stage."""
        return self.root / name

    def is_sealed(self, name: str) -> bool:
        """Whether the stage finished (its manifest exists)."""
        return (self.stage_dir(name) / MANIFEST).is_file()

    def begin(self, name: str) -> Path:
        """Return an empty folder for a stage attempt (an interrupted attempt is cleared)."""
        d = self.stage_dir(name)
        if self.is_sealed(name):
            raise ConfigError(d / MANIFEST, "<file>", "exists",
                              "an unsealed stage (this stage already finished)")
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        return d

    def seal(self, name: str, upstream: list[str], meta: dict[str, Any] | None = None) -> Path:
        """Hash every file of the stage folder and write its manifest (last, atomically)."""
        d = self.stage_dir(name)
        files: dict[str, dict[str, Any]] = {}
        for f in sorted(p for p in d.rglob("*") if p.is_file()):
            rel = f.relative_to(d).as_posix()
            if rel == MANIFEST or f.name.startswith("."):
                continue
            files[rel] = {"sha256": sha256_of(f), "bytes": f.stat().st_size}
        ups = {}
        for u in upstream:
            ups[u] = sha256_of(self.stage_dir(u) / MANIFEST)
        manifest = {
            "format": MANIFEST_FORMAT,
            "stage": name,
            "sealed_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": files,
            "upstream": ups,
            "meta": meta or {},
        }
        return write_json(d / MANIFEST, manifest)

    def verify(self, name: str) -> StageRecord:
        """Re-hash a sealed stage; ArtifactError names the first file that does not match."""
        d = self.stage_dir(name)
        mpath = d / MANIFEST
        data = read_json(mpath)
        if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
            raise ArtifactError(mpath, "format", data.get("format") if isinstance(data, dict)
                                else None, MANIFEST_FORMAT)
        files = data.get("files")
        if not isinstance(files, dict):
            raise ArtifactError(mpath, "files", files, "a mapping of artifacts to hashes")
        for rel, rec in files.items():
            f = d / rel
            if not f.is_file():
                raise ArtifactError(f, "<file>", "missing",
                                    f"the artifact sealed by {mpath} (sha256 {rec['sha256']})")
            actual = sha256_of(f)
            if actual != rec.get("sha256"):
                raise ArtifactError(
                    f, "sha256", actual,
                    f"{rec.get('sha256')} as sealed in {mpath}: the artifact was modified or "
                    f"corrupted since; delete the folder {d} to recompute this stage and the "
                    "ones after it",
                )
        for up, want in (data.get("upstream") or {}).items():
            up_manifest = self.stage_dir(up) / MANIFEST
            have = sha256_of(up_manifest) if up_manifest.is_file() else "missing"
            if have != want:
                raise ArtifactError(
                    up_manifest, "sha256", have,
                    f"{want} (stage {name} was computed from that {up}); delete {d} to "
                    "recompute it from the current one",
                )
        return StageRecord(name, files, dict(data.get("upstream") or {}),
                           dict(data.get("meta") or {}), sha256_of(mpath))

    def artifact(self, stage: str, rel: str) -> Path:
        """Return the path of an artifact of a sealed stage, checking its hash again."""
        rec = self.verify(stage)
        if rel not in rec.files:
            raise ArtifactError(self.stage_dir(stage) / MANIFEST, "files", rel,
                                f"one of the sealed artifacts {sorted(rec.files)}")
        return self.stage_dir(stage) / rel
