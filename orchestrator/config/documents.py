"""YAML and JSON documents that remember where each key was written.

Shared by the cluster file and suite loaders: parse text into plain data
whose mappings and lists carry their source positions, and turn YAML and
pydantic errors into one-line `ConfigError`s naming the file, the key path
and, where known, the line.
"""

from __future__ import annotations

import json
import os
import re
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel

from orchestrator.config.yaml_words import explain, shown
from orchestrator.errors import ConfigError as ConfigError


class _Readable(typing.Protocol):
    def read_bytes(self) -> bytes: ...


def read_document_text(path: str | _Readable, what: str) -> str:
    """The file's text (UTF-8, a leading BOM dropped), or a one-line ConfigError."""
    source = str(path)
    try:
        if isinstance(path, str):
            data = Path(os.path.expanduser(path)).read_bytes()
        else:
            data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{source}: is a directory, not a {what}") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{source}:{line}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
    return text.removeprefix("\ufeff")


class _MarkedDict(dict[Any, Any]):
    """A YAML mapping that remembers where each key was written."""

    mark: yaml.Mark | None = None
    key_marks: dict[Any, yaml.Mark]


class _MarkedList(list[Any]):
    """A YAML sequence that remembers where each item was written."""

    mark: yaml.Mark | None = None
    item_marks: list[yaml.Mark]


class MarkingLoader(yaml.SafeLoader):
    """SafeLoader that records node positions and refuses duplicate keys.

    PyYAML silently keeps the last of two equal keys; in a cluster file that
    hides a mistake (two `ssh:` blocks, one ignored), so it is an error here.
    """


def _construct_mapping(loader: MarkingLoader, node: yaml.MappingNode) -> _MarkedDict:
    explicit = sum(1 for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge")
    loader.flatten_mapping(node)
    # After flattening, merged (`<<: *anchor`) pairs come first; explicit keys
    # may override those, but not repeat each other.
    first_explicit = len(node.value) - explicit
    out = _MarkedDict()
    out.mark = node.start_mark
    out.key_marks = {}
    for index, (key_node, value_node) in enumerate(node.value):
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value", key_node.start_mark
            ) from None
        if key in out and index >= first_explicit and out.key_marks[key].line >= 0:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {key!r} (first at line {out.key_marks[key].line + 1})",
                key_node.start_mark,
            )
        out[key] = loader.construct_object(value_node, deep=True)
        mark = key_node.start_mark
        if index < first_explicit:
            # Merged from elsewhere: a later explicit key may override it.
            mark = yaml.Mark(mark.name, mark.index, -1 - mark.line, mark.column, None, 0)
        out.key_marks[key] = mark
    return out


def _construct_sequence(loader: MarkingLoader, node: yaml.SequenceNode) -> _MarkedList:
    out = _MarkedList(loader.construct_object(child, deep=True) for child in node.value)
    out.mark = node.start_mark
    out.item_marks = [child.start_mark for child in node.value]
    return out


MarkingLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
MarkingLoader.add_constructor("tag:yaml.org,2002:seq", _construct_sequence)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def _line_of(mark: yaml.Mark | None) -> int | None:
    if mark is None:
        return None
    line = mark.line if mark.line >= 0 else -1 - mark.line
    return line + 1


def yaml_error(source: str, exc: yaml.YAMLError, text: str | None = None) -> ConfigError:
    """One line: where the structure broke and what is wrong there, in words a
    person uses, with the line as written (`yaml_words`); PyYAML's own words
    for what that does not know."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    context_mark = getattr(exc, "context_mark", None)
    if text is not None and mark is not None:
        explained = explain(
            text,
            problem,
            mark.line + 1,
            mark.column + 1,
            context,
            None if context_mark is None else context_mark.line + 1,
            None if context_mark is None else context_mark.column + 1,
        )
        if explained is not None:
            written = shown(text, explained.line)
            return ConfigError(
                f"{source}:{explained.line}:{explained.column}: {explained.message}"
                + (f' (line {explained.line}: "{written}")' if written else "")
            )
    message = one_line(problem)
    if context and context_mark is not None and context_mark is not mark:
        message += f" ({one_line(context)} at line {context_mark.line + 1})"
    if mark is None:
        return ConfigError(f"{source}: YAML error: {message}")
    return ConfigError(f"{source}:{mark.line + 1}:{mark.column + 1}: {message}")


class _DuplicateJSONKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            # JSON parsers keep the last duplicate; in node_dict that silently
            # drops a host, so refuse.
            raise _DuplicateJSONKey(key)
        out[key] = value
    return out


def _parse_json(text: str, source: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_json_object)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}:{exc.lineno}:{exc.colno}: {exc.msg}") from None
    except _DuplicateJSONKey as exc:
        raise ConfigError(f"{source}: duplicate key {exc.key!r} in a JSON object") from None


def parse_document(text: str, source: str) -> Any:
    if text.startswith("\ufeff"):
        text = text[1:]
    if source.lower().endswith(".json"):
        return _parse_json(text, source)
    try:
        return yaml.load(text, Loader=MarkingLoader)
    except yaml.YAMLError as exc:
        if text.lstrip().startswith("{"):
            # JSON that YAML rejects (tabs, for one) is still a valid cluster file.
            try:
                return json.loads(text, object_pairs_hook=_json_object)
            except (ValueError, _DuplicateJSONKey, RecursionError):
                pass
        raise yaml_error(source, exc, text) from None


# ---- describing values and paths in plain words ---------------------------


def describe_value(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({'true' if value else 'false'})"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a number ({value})"
    if isinstance(value, str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        return f"a string ({shown!r})"
    if isinstance(value, list | tuple | set):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def _format_path(path: list[Any] | tuple[Any, ...]) -> str:
    out = ""
    for el in path:
        if isinstance(el, int) and not isinstance(el, bool):
            out += f"[{el}]"
        elif isinstance(el, str) and re.match(r"^[A-Za-z_][A-Za-z0-9_-]*$", el):
            out += f".{el}" if out else el
        else:
            out += f"[{el!r}]"
    return out or "(top level)"


def _lookup_mark(root: Any, path: list[Any]) -> yaml.Mark | None:
    """The position of the deepest part of `path` that exists in the raw data."""
    mark = getattr(root, "mark", None)
    node = root
    for el in path:
        if isinstance(node, _MarkedDict) and el in node:
            mark = node.key_marks.get(el, mark)
            node = node[el]
        elif (
            isinstance(node, _MarkedList)
            and isinstance(el, int)
            and not isinstance(el, bool)
            and 0 <= el < len(node)
        ):
            mark = node.item_marks[el]
            node = node[el]
        else:
            break
    return mark


class Located:
    """Builds `FILE[:LINE]: key.path: message` lines for one source."""

    def __init__(self, source: str, raw: Any) -> None:
        self.source = source
        self.raw = raw

    def error(self, path: list[Any], message: str) -> str:
        line = _line_of(_lookup_mark(self.raw, path))
        where = f"{self.source}:{line}" if line is not None else self.source
        return one_line(f"{where}: {_format_path(path)}: {message}")


# ---- pydantic errors -> one line ------------------------------------------


def _unwrap(tp: Any) -> Any:
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _union_members(tp: Any) -> list[Any] | None:
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        members = [_unwrap(m) for m in typing.get_args(tp) if m is not type(None)]
        return members if len(members) > 1 else None
    return None


def _strip_none(tp: Any) -> Any:
    tp = _unwrap(tp)
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        members = [m for m in typing.get_args(tp) if m is not type(None)]
        if len(members) == 1:
            return _unwrap(members[0])
    return tp


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _branch_words(tag: str) -> str:
    if tag.startswith("literal["):
        return tag[len("literal[") : -1].replace("True", "true").replace("False", "false")
    return {
        "str": "a string",
        "int": "an integer",
        "float": "a number",
        "bool": "true or false",
        "list": "a list",
        "dict": "a mapping",
    }.get(tag, "a mapping")


class _ErrorPath:
    """A pydantic error location walked against the model's types.

    Union members show up in pydantic's location as tags (`GPURequest`,
    `literal['all']`); they are dropped from the user-facing path but kept
    so that errors from the branches of one union can be merged.
    """

    def __init__(self, loc: tuple[Any, ...], root: type[BaseModel]) -> None:
        self.path: list[Any] = []
        self.union_at: int | None = None  # len(self.path) where a union branched
        self.branch: str | None = None
        self.branch_is_model = False
        self.depth_after_branch = 0
        self.model: type[BaseModel] | None = None  # model owning the last key
        self.dict_key = False
        tp: Any = root
        for el in loc:
            tp = _strip_none(tp)
            members = _union_members(tp)
            if members is not None and isinstance(el, str) and self.union_at is None:
                self.union_at = len(self.path)
                self.branch = el
                chosen = next(
                    (m for m in members if _is_model(m) and m.__name__ == el),
                    None,
                )
                self.branch_is_model = chosen is not None
                tp = chosen if chosen is not None else Any
                continue
            if self.union_at is not None:
                self.depth_after_branch += 1
            if _is_model(tp):
                self.model = tp
                fields = tp.model_fields
                self.path.append(el)
                tp = fields[el].annotation if isinstance(el, str) and el in fields else Any
                continue
            origin = typing.get_origin(tp)
            if el == "[key]":
                self.dict_key = True
                continue
            self.path.append(el)
            if origin is list and isinstance(el, int):
                tp = typing.get_args(tp)[0]
            elif origin is dict:
                tp = typing.get_args(tp)[1]
            else:
                tp = Any


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _num(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _error_message(err: dict[str, Any], where: _ErrorPath) -> str:
    kind = err["type"]
    value = err.get("input")
    ctx = err.get("ctx") or {}
    got = describe_value(value)
    if kind == "extra_forbidden":
        key = where.path[-1] if where.path else "?"
        model_fields = where.model.model_fields if where.model is not None else {}
        # What the loader sets (source, source_file, cvs_notes, slurm) is no
        # key a user may write: never offered as one.
        fields = [
            name
            for name, info in model_fields.items()
            if not (
                isinstance(info.json_schema_extra, dict)
                and info.json_schema_extra.get("set_by_loader")
            )
        ]
        import difflib  # only for an unknown key: not on every load (tests/test_startup.py)

        close = difflib.get_close_matches(str(key), fields, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if not hint and fields:
            hint = f" (known keys: {', '.join(fields)})"
        return f"unknown key{hint}"
    if kind == "missing":
        return "required key is missing"
    if kind == "invalid_key":
        return "keys must be strings"
    if kind in ("value_error", "assertion_error"):
        error = ctx.get("error")
        return str(error) if error is not None else err["msg"].removeprefix("Value error, ")
    if kind == "literal_error":
        expected = str(ctx.get("expected", "")).replace("True", "true").replace("False", "false")
        hint = ""
        if isinstance(value, bool):
            # `host_key_policy: off` unquoted: YAML 1.1 reads on/off/yes/no as booleans.
            words = "on, yes, true" if value else "off, no, false"
            hint = f' (YAML reads unquoted {words} as a boolean: quote the word, e.g. "off")'
        return f"invalid value: expected {expected}, got {got}{hint}"
    if kind in ("int_parsing", "int_type"):
        return f"expected an integer, got {got}"
    if kind == "int_from_float":
        return f"expected a whole number, got {got}"
    if kind in ("float_parsing", "float_type"):
        return f"expected a number, got {got}"
    if kind in ("bool_parsing", "bool_type"):
        return f"expected true or false, got {got}"
    if kind == "string_type":
        hint = " (quote it)" if isinstance(value, int | float) else ""
        noun = "key" if where.dict_key else "value"
        return f"expected a string {noun}, got {got}{hint}"
    if kind in ("list_type", "tuple_type", "set_type"):
        return f"expected a list, got {got}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"expected a mapping, got {got}"
    if kind == "too_short":
        least = ctx.get("min_length", 1)
        return "needs at least one entry" if least == 1 else f"needs at least {least} entries"
    if kind == "greater_than":
        return f"must be greater than {_num(ctx.get('gt'))}, got {_show(value)}"
    if kind == "greater_than_equal":
        return f"must be at least {_num(ctx.get('ge'))}, got {_show(value)}"
    if kind == "less_than":
        return f"must be less than {_num(ctx.get('lt'))}, got {_show(value)}"
    if kind == "less_than_equal":
        return f"must be at most {_num(ctx.get('le'))}, got {_show(value)}"
    if kind in ("finite_number",):
        return f"must be a finite number, got {_show(value)}"
    return one_line(err.get("msg", kind))


def validation_lines(
    errors: list[Any],
    located: Located,
    user_path: Callable[[list[Any]], list[Any]],
    root: type[BaseModel],
) -> list[str]:
    """One message per problem, union branches merged, in pydantic's order.

    `user_path` maps a path in the validated document to the path as written
    in the file (hosts are expanded before validation).
    """
    walked = [_ErrorPath(tuple(e["loc"]), root) for e in errors]
    for w in walked:
        w.path = user_path(w.path)
    # The real mistake first: an unknown key (`imgae:`) is usually why a
    # required one (`image:`) reads as missing, and its suggestion says the fix.
    order = sorted(range(len(errors)), key=lambda i: errors[i]["type"] != "extra_forbidden")
    errors, walked = [errors[i] for i in order], [walked[i] for i in order]
    lines: list[str] = []
    done_unions: set[tuple[str, ...]] = set()
    for err, where in zip(errors, walked, strict=True):
        if where.union_at is not None:
            key = tuple(map(str, where.path[: where.union_at]))
            if key in done_unions:
                continue
            done_unions.add(key)
            group = [
                (e, w)
                for e, w in zip(errors, walked, strict=True)
                if w.union_at is not None and tuple(map(str, w.path[: w.union_at])) == key
            ]
            deeper = [(e, w) for e, w in group if w.branch_is_model and w.depth_after_branch]
            if deeper:
                # The value was a mapping meant for the model branch: report
                # what is wrong inside it, not that it isn't 'all'.
                for e, w in deeper:
                    lines.append(located.error(w.path, _error_message(e, w)))
                continue
            union_path = where.path[: where.union_at]
            choices: list[str] = []
            for _, w in group:
                words = _branch_words(w.branch or "")
                if words not in choices:
                    choices.append(words)
            got = describe_value(err.get("input"))
            lines.append(
                located.error(
                    union_path,
                    f"expected {' or '.join(choices)}, got {got}",
                )
            )
            continue
        lines.append(located.error(where.path, _error_message(err, where)))
    # A hostlist entry that expanded to many hosts yields the same complaint
    # once per host; say it once.
    return list(dict.fromkeys(lines))


def first_problem(lines: list[str]) -> ConfigError:
    """The first problem in one line, the count of the others; every one of
    them in `problems` (what `cvs validate` and `-v` list)."""
    first = lines[0]
    more = len(lines) - 1
    if more:
        first += f" (and {more} more problem{'s' if more > 1 else ''})"
    error = ConfigError(first)
    error.problems = list(lines)  # type: ignore[attr-defined]
    return error


# ---- where each key was written (for hints about runtime errors) ----------


def key_lines(text: str, source: str) -> dict[str, int]:
    """`{"container.ulimits.memlock": 72, "container.group_add[1]": 68, ...}`:
    the line each key (and list item) of a YAML document was written on, by
    dotted path. A JSON file, or text that does not parse, gives what it can
    ({} for those): a hint then names the key without a line."""
    try:
        data = parse_document(text, source)
    except (ConfigError, RecursionError):
        return {}
    out: dict[str, int] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, _MarkedDict):
            for key, value in node.items():
                child = f"{path}.{key}" if path else str(key)
                line = _line_of(node.key_marks.get(key))
                if line is not None:
                    out[child] = line
                walk(value, child)
        elif isinstance(node, _MarkedList):
            for index, (value, mark) in enumerate(zip(node, node.item_marks, strict=False)):
                child = f"{path}[{index}]"
                line = _line_of(mark)
                if line is not None:
                    out[child] = line
                walk(value, child)

    walk(data, "")
    return out
