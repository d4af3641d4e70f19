"""Reading inputs with typed errors and writing results atomically.

Every result file goes through :func:`atomic_write`: the bytes are written
to a temporary file in the destination directory, flushed, fsync'ed and
renamed over the target, so an interrupted run leaves either the old file
or the complete new one, never half of one.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputFileError


def atomic_write(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; the directory must exist."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputFileError(f"cannot write {path}: directory {parent} does not exist; create it first")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def _json_default(obj: Any):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if hasattr(obj, "__array__"):
        return np.asarray(obj).tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    text = json.dumps(obj, indent=2, default=_json_default, allow_nan=True) + "\n"
    return atomic_write(path, text.encode())


def atomic_save_npy(path: str | os.PathLike, array) -> Path:
    buf = io.BytesIO()
    np.save(buf, np.asarray(array), allow_pickle=False)
    return atomic_write(path, buf.getvalue())


def atomic_save_npz(path: str | os.PathLike, **arrays) -> Path:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    return atomic_write(path, buf.getvalue())


def save_figure(fig, path: str | os.PathLike, dpi: int = 100) -> Path:
    """Render a matplotlib figure to PNG, write it atomically and close the figure."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return atomic_write(path, buf.getvalue())


def load_array(path: str | os.PathLike, what: str) -> np.ndarray:
    """Load a ``.npy`` file (no pickles) or raise :class:`InputFileError` naming ``what``."""
    path = Path(path)
    if path.is_dir():
        raise InputFileError(f"{what}: {path} is a directory, expected a .npy file")
    if not path.is_file():
        raise InputFileError(f"{what}: file {path} does not exist")
    try:
        with open(path, "rb") as fh:
            head = fh.read(6)
    except OSError as exc:
        raise InputFileError(f"{what}: cannot read {path} ({exc})") from exc
    if head != b"\x93NUMPY" and head[:2] != b"PK":
        # numpy would say "contains pickled (object) data" for any file without the magic string
        raise InputFileError(f"{what}: {path} is not a .npy file (it does not start with the .npy magic string; "
                             "save arrays with numpy.save)")
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as exc:  # numpy raises several types for corrupt files
        raise InputFileError(f"{what}: cannot read {path} as a .npy array ({exc})") from exc
    if not isinstance(arr, np.ndarray):
        raise InputFileError(f"{what}: {path} holds an archive, expected a single .npy array")
    return arr


def load_json(path: str | os.PathLike, what: str) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise InputFileError(f"{what}: file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputFileError(f"{what}: cannot read {path} as JSON ({exc})") from exc
