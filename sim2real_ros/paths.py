"""Find the package's shared files (config/, urdf/, launch/) installed or in the source tree.

`pip install -e .` ignores data_files, and a colcon install puts them under share/; one helper
serves both so no module hard-codes a path.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = "sim2real_ros"
SOURCE_ROOT = Path(__file__).resolve().parent.parent


def share_dir() -> Path:
    """Return the directory that holds config/, urdf/ and launch/."""
    if (SOURCE_ROOT / "package.xml").is_file() and (SOURCE_ROOT / "urdf").is_dir():
        return SOURCE_ROOT
    try:
        from ament_index_python.packages import get_package_share_directory

        return Path(get_package_share_directory(PACKAGE))
    except Exception as exc:  # noqa: BLE001 - any lookup failure means "not installed by colcon"
        raise FileNotFoundError(
            f"cannot find the {PACKAGE} share directory: not in a source tree ({SOURCE_ROOT}) "
            f"and not in the ament index ({exc})"
        ) from exc


def share_path(*parts: str) -> Path:
    """Return a path under the share directory, e.g. share_path('urdf', 'sim2real_arm.urdf')."""
    return share_dir().joinpath(*parts)


def default_urdf() -> Path:
    """Return the path of the shipped arm's URDF."""
    return share_path("urdf", "sim2real_arm.urdf")
