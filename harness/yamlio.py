"""The hardened YAML reader of every file xfalign reads from users (case files, numerics profiles, maps): size,
UTF-8, nesting depth, alias expansion and duplicate keys checked, and the line of each field kept, so that
every problem is one line naming the file, the line and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from harness.errors import XfalignError

MAX_YAML_DEPTH = 32  # nesting levels of mappings and lists
MAX_READABLE_DEPTH = 100  # beyond this a file is refused before its nodes are built
MAX_YAML_NODES = 100_000  # nodes visited, aliases followed (a "billion laughs" file stops here)


class DuplicateKey(yaml.constructor.ConstructorError):
    """A key given twice in one mapping (plain YAML silently keeps the last)."""

    def __init__(self, mapping: yaml.MappingNode, key: Any, key_node: yaml.Node, first_line: int):
        super().__init__("while constructing a mapping", mapping.start_mark,
                         f"duplicate key {key!r} (first at line {first_line})", key_node.start_mark)
        self.mapping, self.key = mapping, key


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_line: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults` may be overridden: not a duplicate
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = key in first_line
                except TypeError:  # an unhashable key: the base class refuses it
                    continue
                if seen:
                    raise DuplicateKey(node, key, key_node, first_line[key])
                first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


class _YamlShape(Exception):
    def __init__(self, node: yaml.Node, path: tuple, message: str):
        super().__init__(message)
        self.line, self.path, self.message = node.start_mark.line + 1, path, message


def _key_name(key: yaml.Node) -> Any:
    return key.value if isinstance(key, yaml.ScalarNode) else f"<{getattr(key, 'id', '?')} key>"


def _line_map(root: yaml.Node) -> tuple[dict[tuple, int], dict[int, tuple]]:
    """Map each field path (keys and list indices) to its 1-based line in the YAML text, and each
    mapping node to its path. Refuses recursive aliases, deep nesting and files that expand (through
    aliases) to more than MAX_YAML_NODES nodes, so nothing after this can recurse or blow up."""
    lines: dict[tuple, int] = {}
    paths: dict[int, tuple] = {}
    stack: list[tuple[yaml.Node, tuple, frozenset[int]]] = [(root, (), frozenset())]
    visited = 0
    while stack:
        node, path, ancestors = stack.pop()
        visited += 1
        if visited > MAX_YAML_NODES:
            raise _YamlShape(node, path, f"the file expands to more than {MAX_YAML_NODES:,} values (anchors and aliases followed)")
        if id(node) in ancestors:
            raise _YamlShape(node, path, "an alias refers to a value that contains it (a recursive structure)")
        if len(path) > MAX_YAML_DEPTH:
            raise _YamlShape(node, path, f"nested more than {MAX_YAML_DEPTH} levels deep")
        lines.setdefault(path, node.start_mark.line + 1)
        paths.setdefault(id(node), path)
        inner = ancestors | {id(node)}
        if isinstance(node, yaml.MappingNode):
            for key, _ in reversed(node.value):
                lines[path + (_key_name(key),)] = key.start_mark.line + 1
            for key, value in reversed(node.value):
                stack.append((value, path + (_key_name(key),), inner))
        elif isinstance(node, yaml.SequenceNode):
            for index in range(len(node.value) - 1, -1, -1):
                stack.append((node.value[index], path + (index,), inner))
    return lines, paths


def line_and_field(lines: dict[tuple, int], loc: tuple) -> tuple[int, str]:
    """Longest prefix of a pydantic/family location that exists in the file, and its dotted name (pydantic's
    validator names, such as function-after[...], left out)."""
    data_loc = tuple(p for p in loc if not (isinstance(p, str) and "[" in p))
    for n in range(len(data_loc), -1, -1):
        if data_loc[:n] in lines:
            return lines[data_loc[:n]], ".".join(str(p) for p in data_loc) or "(top level)"
    return 1, ".".join(str(p) for p in data_loc)


def _check_readable_depth(text: str) -> None:
    """PyYAML builds nodes recursively: refuse a file nested beyond what can be read from the parser's
    event stream first (iterative, so a 2000-level file is refused in milliseconds, not by a slow
    RecursionError). Files nested less deeply but beyond MAX_YAML_DEPTH get the field-naming error later."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_READABLE_DEPTH:
                raise RecursionError
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def read_yaml(path: Path, what: str, error_type: type[XfalignError], max_bytes: int) -> tuple[Any, dict[tuple, int]]:
    """A YAML file of xfalign's (`what`: "case file", "map file") parsed with the guards every such file
    gets (size, UTF-8, depth, duplicate keys, aliases), and the line of each field: (data, lines). Any
    problem is an `error_type` of one line naming the file, the line and the field."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise error_type(f"{path}: cannot read {what}: {error.strerror or error}") from None
    if len(raw) > max_bytes:
        raise error_type(f"{path}:1: (file): the {what} has {len(raw):,} bytes; a {what} is at most {max_bytes:,}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw[:error.start].count(b"\n") + 1
        raise error_type(f"{path}:{line}: (file): not UTF-8 text (byte 0x{raw[error.start]:02x} at offset "
                         f"{error.start}); save the {what} as UTF-8") from None
    paths: dict[int, tuple] = {}
    try:
        _check_readable_depth(text)
        loader = UniqueKeyLoader(text)  # checks for unprintable characters first
        try:
            node = loader.get_single_node()
            lines, paths = _line_map(node) if node is not None else ({}, {})
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except DuplicateKey as error:
        field = ".".join(str(p) for p in (*paths.get(id(error.mapping), ()), error.key))
        where = error.problem_mark.line + 1 if error.problem_mark else "?"
        raise error_type(f"{path}:{where}: {field}: {error.problem}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = mark.line + 1 if mark else text[:getattr(error, "position", 0)].count("\n") + 1
        problem = getattr(error, "problem", None) or (str(error).splitlines() or ["cannot parse"])[0]
        raise error_type(f"{path}:{line}: (yaml): {problem}") from None
    except _YamlShape as error:
        raise error_type(f"{path}:{error.line}: {'.'.join(map(str, error.path)) or '(top level)'}: {error.message}") from None
    except RecursionError:
        raise error_type(f"{path}:1: (yaml): nested too deeply to read (at most {MAX_YAML_DEPTH} levels)") from None
    return data, lines
