"""Errors a user can act on. Each names the place (file, line or record, field) it is about."""

from __future__ import annotations

import os
import re


class CtrError(Exception):
    """Base for every error ctrtrain reports to a user (the CLI prints it without a traceback)."""


class DataError(CtrError):
    """Bad input data; names the file and, where known, the line (1-based) or record (0-based)."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None,
                 record: int | None = None, field: str | None = None):
        self.path, self.line, self.record, self.field = path, line, record, field
        self.reason = message
        where = []
        if path is not None:
            where.append(str(path))
        if line is not None:
            where.append(f"line {line}")
        if record is not None:
            where.append(f"record {record}")
        if field is not None:
            where.append(f"field {field}")
        super().__init__((": ".join([", ".join(where), message])) if where else message)


class ConfigError(CtrError):
    """A bad flag, job spec key or value; the message names it and what is allowed."""


def first_line(e: Exception) -> str:
    """An error's message, its first line: a TensorFlow OpError's rest is a C++ stack, and
    its `{{function_node ...}}` prefix and `[Op:...]` suffix name TensorFlow's internals."""
    text = (getattr(e, "message", None) or str(e)).strip()
    if not text:
        return type(e).__name__
    line = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", text.splitlines()[0])
    return re.sub(r"\s*\[Op:[A-Za-z0-9_]+\]$", "", line) or text.splitlines()[0]


def named(error: OSError, path: str | os.PathLike) -> OSError:
    """`error` naming `path` when it names no file: a write or close that fails (a full disk)
    raises from the file object, which does not say which file it was."""
    if error.filename is not None:
        return error
    return OSError(error.errno, error.strerror or str(error), str(path))
