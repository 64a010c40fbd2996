"""The strict pydantic base of every file format read from users (cases, numerics profiles, capture trees),
the rule for names that become file names, and the error a validator raises naming a field."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict

# Case and side names become file and folder names (dumps, reports, goldens): no paths, no surprises.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MAX_NAME_CHARS = 128
NAME_RULE = "letters, digits, '_', '.' and '-', starting with a letter or digit, no '..'"


def is_safe_name(name: Any) -> bool:
    return (isinstance(name, str) and len(name) <= MAX_NAME_CHARS and SAFE_NAME.match(name) is not None
            and ".." not in name)


class FieldProblem(Exception):
    """Raised by op families during validation; `path` names the field in the case."""

    def __init__(self, path: tuple, message: str):
        super().__init__(message)
        self.path = path
        self.message = message


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
