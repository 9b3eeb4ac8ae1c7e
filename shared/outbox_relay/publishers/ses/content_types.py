"""An attachment's content type by the table in content_types.txt: the same guess on every machine."""

from __future__ import annotations

import posixpath
from importlib import resources

#: Used when the file name has no extension the table knows.
DEFAULT_CONTENT_TYPE = "application/octet-stream"


def _load() -> dict[str, str]:
    table = {}
    for line in resources.files(__package__).joinpath("content_types.txt").read_text("utf-8").splitlines():
        if line and not line.startswith("#"):
            extension, content_type = line.split()
            table[extension] = content_type
    return table


#: Extension (lower-case ASCII, no dot) -> content type.
CONTENT_TYPES: dict[str, str] = _load()


def guess_content_type(filename: str) -> str:
    extension = posixpath.splitext(filename)[1][1:]
    if not extension.isascii():  # str.lower() folds some non-ASCII letters to ASCII ones (K, the Kelvin sign)
        return DEFAULT_CONTENT_TYPE
    return CONTENT_TYPES.get(extension.lower(), DEFAULT_CONTENT_TYPE)
