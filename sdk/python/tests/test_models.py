"""The models of `_models.py` against the daemon's own description of its
answers, `GET /v1/openapi.json`: each model is fed documents made from the
schema it names (`_models.SCHEMAS`), every field, only the required ones,
with nulls and without, and must read only fields of that schema, read every
field it requires (unless the model lists it as unread), and end with
attributes of their annotated types."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Iterator

import httpx
import pytest

from cairn import _models
from cairn._models import SCHEMAS, Schema, TaskInfo

Path = tuple[str, ...]


@pytest.fixture(scope="module")
def components(daemon: tuple[str, str]) -> dict[str, Any]:
    # The document needs no token: tools fetch it before they hold one.
    r = httpx.get(f"{daemon[0]}/v1/openapi.json", timeout=30)
    r.raise_for_status()
    return r.json()["components"]["schemas"]


class Reads(dict):
    """A JSON object that notes the path of every field read from it, and
    hands out its objects (also inside arrays) noting theirs."""

    def __init__(self, value: dict[str, Any], path: Path, log: set[Path]) -> None:
        super().__init__(value)
        self._path, self._log = path, log

    def _wrap(self, key: str, v: Any) -> Any:
        if isinstance(v, dict):
            return Reads(v, self._path + (key,), self._log)
        if isinstance(v, list):
            return [Reads(x, self._path + (key, "[]"), self._log) if isinstance(x, dict) else x for x in v]
        return v

    def __getitem__(self, key: str) -> Any:
        self._log.add(self._path + (key,))
        return self._wrap(key, super().__getitem__(key))

    def get(self, key: str, default: Any = None) -> Any:
        self._log.add(self._path + (key,))
        return self._wrap(key, super().get(key, default))


class Doc:
    """The schemas of the document, and what to make of them."""

    def __init__(self, components: dict[str, Any]) -> None:
        self.components = components

    def resolve(self, s: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in s:
            s = self.components[s["$ref"].rsplit("/", 1)[-1]]
        return s

    def unnull(self, s: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """Whether `s` takes null, and `s` without it (OpenAPI 3.1 says
        `Option<T>` as a type list with "null", or a oneOf with a null)."""
        s = self.resolve(s)
        kinds = s.get("type")
        if isinstance(kinds, list) and "null" in kinds:
            rest = [k for k in kinds if k != "null"]
            return True, {**s, "type": rest[0] if len(rest) == 1 else rest}
        alts = s.get("oneOf") or s.get("anyOf")
        if alts and any(self.resolve(a).get("type") == "null" for a in alts):
            rest = [a for a in alts if self.resolve(a).get("type") != "null"]
            return True, self.resolve(rest[0]) if len(rest) == 1 else {"oneOf": rest}
        return False, s

    def fields(self, s: dict[str, Any]) -> tuple[dict[str, Any], set[str]] | None:
        """An object's properties and required names (flattened structs are
        an allOf; an enum of objects a oneOf, whose variants all require
        what it requires); None when `s` is no object."""
        s = self.resolve(s)
        if "allOf" in s or "oneOf" in s:
            parts = [self.fields(p) for p in s.get("allOf") or s["oneOf"]]
            if any(p is None for p in parts):
                return None
            props = {k: v for p, _ in parts for k, v in p.items()}
            sets = [r for _, r in parts]
            return props, set.union(*sets) if "allOf" in s else set.intersection(*sets)
        if s.get("type") == "object" or "properties" in s:
            return dict(s.get("properties", {})), set(s.get("required", []))
        return None

    def lookup(self, name: str, path: Path) -> str | None:
        """Why `path` is not a field of schema `name`, or None when it is."""
        s: dict[str, Any] = {"$ref": f"#/components/schemas/{name}"}
        for i, step in enumerate(path):
            _, s = self.unnull(s)
            if step == "[]":
                if s.get("type") != "array":
                    return f"{'.'.join(path[:i])} is no array in {name}"
                s = s["items"]
                continue
            obj = self.fields(s)
            if obj is None or step not in obj[0]:
                return f"{'.'.join(p for p in path[: i + 1] if p != '[]')}, which {name} does not have"
            s = obj[0][step]
        return None

    def sample(self, s: dict[str, Any], optional: bool, nulls: str) -> Any:
        """A value of schema `s`: with the optional fields or not; with
        nulls for no nullable field, for the nullable fields that are no
        object (`leaves`), or for all."""
        nullable, s = self.unnull(s)
        obj = self.fields(s)
        if nullable and (nulls == "all" or (nulls == "leaves" and obj is None)):
            return None
        if obj is not None:
            props, required = obj
            return {k: self.sample(v, optional, nulls) for k, v in props.items() if optional or k in required}
        s = self.resolve(s)
        if "enum" in s:
            return s["enum"][0]
        kind = s.get("type")
        if kind == "array":
            return [self.sample(s["items"], optional, nulls)]
        return {"string": "x", "integer": 7, "number": 7.5, "boolean": True}.get(kind, {"any": "value"})


def type_problem(value: Any, hint: Any) -> str | None:
    """Why `value` is not of type `hint`, or None when it is."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return None
    if origin in (typing.Union, types.UnionType):
        problems = [type_problem(value, h) for h in typing.get_args(hint)]
        return None if None in problems else f"{value!r} is none of {hint}"
    if origin is list:
        if not isinstance(value, list):
            return f"{value!r} is no list"
        (item,) = typing.get_args(hint)
        return next((p for p in (type_problem(v, item) for v in value) if p), None)
    if origin is dict:
        return None if isinstance(value, dict) else f"{value!r} is no dict"
    if hint is type(None):
        return None if value is None else f"{value!r} is not None"
    # JSON numbers: an int does for a float; a bool is no int.
    if hint is float and type(value) is int:
        return None
    if isinstance(value, bool) and hint is not bool:
        return f"{value!r} is no {hint.__name__}"
    return None if isinstance(value, hint) else f"{value!r} is no {hint.__name__}"


def attribute_problems(obj: Any) -> Iterator[str]:
    """Attributes (also of nested models) whose values are not of their
    annotated types."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        problem = type_problem(value, hints[f.name])
        if problem:
            yield f"{type(obj).__name__}.{f.name}: {problem}"
        for nested in value if isinstance(value, list) else [value]:
            if dataclasses.is_dataclass(nested):
                yield from attribute_problems(nested)


def problems(doc: Doc, model: type, schema: Schema) -> list[str]:
    """Every way `model` disagrees with `schema` of the document."""
    if schema.name not in doc.components:
        return [f"{model.__name__}: the document has no schema {schema.name}"]
    _, required = doc.fields({"$ref": f"#/components/schemas/{schema.name}"}) or ({}, set())
    out: list[str] = []
    read: set[Path] = set()
    for optional, nulls in [(True, "none"), (True, "leaves"), (True, "all"), (False, "none")]:
        answer = doc.sample({"$ref": f"#/components/schemas/{schema.name}"}, optional, nulls)
        what = f"{model.__name__} from a {schema.name} with {'every field' if optional else 'the required fields'}, nulls: {nulls}"
        try:
            obj = model.from_json(Reads(answer, (), read))
        except Exception as e:  # any failure to read a valid answer is a finding
            out.append(f"{what}: {type(e).__name__}: {e}")
            continue
        out += [f"{what}: {p}" for p in attribute_problems(obj)]
    out += [f"{model.__name__} reads {p}" for p in sorted(filter(None, (doc.lookup(schema.name, path) for path in read)))]
    top = {path[0] for path in read}
    out += [f"{model.__name__} does not read {k}, which {schema.name} requires" for k in sorted(required - top - set(schema.unread))]
    out += [f"{model.__name__} lists {k} as unread but {schema.name} does not require it" for k in schema.unread if k not in required]
    out += [f"{model.__name__} lists {k} as unread but reads it" for k in schema.unread if k in top]
    return out


def test_every_model_reads_what_its_schema_in_the_openapi_document_holds(components):
    doc = Doc(components)
    models = [c for c in vars(_models).values() if isinstance(c, type) and dataclasses.is_dataclass(c)]
    assert models and set(SCHEMAS) == set(models), f"models without a schema in SCHEMAS: {set(models) - set(SCHEMAS)}"
    found = [p for model, schema in SCHEMAS.items() for p in problems(doc, model, schema)]
    assert not found, "\n".join(found)


def test_the_check_finds_a_misspelled_field_a_wrong_type_and_an_unread_required_field(components):
    doc = Doc(components)

    class Misspelled(TaskInfo):
        @classmethod
        def from_json(cls, v: dict[str, Any]) -> TaskInfo:
            v.get("stat")
            return TaskInfo.from_json(v)

    @dataclasses.dataclass(frozen=True)
    class WrongType:
        step: str

        @classmethod
        def from_json(cls, v: dict[str, Any]) -> Any:
            return cls(v["step"])

    assert "Misspelled reads stat, which TaskView does not have" in problems(doc, Misspelled, SCHEMAS[TaskInfo])
    found = problems(doc, WrongType, Schema("TaskView"))
    assert any("WrongType.step: 7 is no str" in p for p in found), found
    assert "WrongType does not read id, which TaskView requires" in found
    # Positive control: the real model, as it is, has none of these.
    assert problems(doc, TaskInfo, SCHEMAS[TaskInfo]) == []
