"""Render a Helm chart the way ``helm template`` does, for the template subset our chart uses.

There is no ``helm`` in Debian (bookworm, trixie or sid) and nothing else may be fetched,
so hack/gen-manifests (the plain manifests, ``testbed.plain_manifests``) and the tests render
deploy/helm/nri-gpu with this instead. It implements only what the
chart's templates use, with Go text/template's and Sprig's semantics, and refuses
everything else by name, so a template that strays from the subset fails the tests
instead of rendering differently from Helm:

* text, ``{{/* comments */}}`` and the ``{{-`` / ``-}}`` white-space trimming;
* ``{{ define "name" }}`` at the top level of a template (in ``_helpers.tpl``);
* ``{{ if PIPELINE }}``, ``{{ else }}``, ``{{ end }}`` (Go truthiness: false, 0, nil,
  and empty strings, lists and maps are false);
* pipelines of commands joined by ``|``, the piped value becoming the last argument;
  arguments are ``.``, fields (``.Values.a.b``, ``.Release.Name``, ``.Release.Namespace``,
  ``.Chart.Name``, ``.Chart.AppVersion``, ``.Chart.Version``), "strings" and integers;
* functions ``include``, ``default``, ``quote``, ``toYaml``, ``toJson``, ``indent``,
  ``nindent``, ``dir`` and ``eq``.

Unlike Helm, a field that is not there is an error, not an empty string: a misspelt
value fails here rather than rendering as nothing.
"""

from __future__ import annotations

import copy
import json
import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Chart", "TemplateError", "load_chart", "render_chart"]

# An action: {{ body }}, with Go's trim markers "{{- " and " -}}".
_ACTION = re.compile(r"\{\{(?P<left>-[ \t\r\n])?(?P<body>.*?)(?P<right>[ \t\r\n]-)?\}\}", re.S)
_SPACE = " \t\r\n"
_TOKEN = re.compile(r'\s*(?:(?P<string>"(?:[^"\\]|\\.)*")|(?P<pipe>\|)|(?P<word>[^\s|"]+))')
_FIELD = re.compile(r"(?:\.[A-Za-z_][A-Za-z0-9_]*)+|\.")
_INT = re.compile(r"-?[0-9]+")
_REFUSED = ("range", "with", "template", "block", "break", "continue")


class TemplateError(ValueError):
    """The template uses something outside the subset, or a value is missing."""


@dataclass
class _Text:
    text: str


@dataclass
class _Output:
    pipeline: str


@dataclass
class _If:
    pipeline: str
    then: list[_Node] = field(default_factory=list)
    otherwise: list[_Node] = field(default_factory=list)


_Node = _Text | _Output | _If


def _lex(source: str, name: str) -> list[tuple[str, str]]:
    """("text", s) and ("action", body) items, with the trim markers already applied."""
    items: list[tuple[str, str]] = []
    pos = 0
    trim_next = False
    for match in _ACTION.finditer(source):
        text = source[pos : match.start()]
        if trim_next:
            text = text.lstrip(_SPACE)
        if match.group("left"):
            text = text.rstrip(_SPACE)
        items.append(("text", text))
        body = match.group("body").strip(_SPACE)
        if not (body.startswith("/*") and body.endswith("*/")):
            items.append(("action", body))
        trim_next = bool(match.group("right"))
        pos = match.end()
    rest = source[pos:]
    if "{{" in rest:
        raise TemplateError(f"{name}: unclosed action near {rest[rest.index('{{') :][:40]!r}")
    items.append(("text", rest.lstrip(_SPACE) if trim_next else rest))
    return items


def _parse(source: str, name: str) -> tuple[list[_Node], dict[str, list[_Node]]]:
    """The template's nodes and the templates it defines."""
    defines: dict[str, list[_Node]] = {}
    top: list[_Node] = []
    # Open blocks: (keyword, the list new nodes go to, the _If or the define's name).
    stack: list[tuple[str, list[_Node], Any]] = [("top", top, None)]
    for kind, value in _lex(source, name):
        keyword, _, rest = value.partition(" ")
        current = stack[-1][1]
        if kind == "text":
            if value:
                current.append(_Text(value))
        elif keyword == "if":
            node = _If(rest.strip())
            current.append(node)
            stack.append(("if", node.then, node))
        elif keyword == "else":
            if rest.strip() or stack[-1][0] != "if":
                raise TemplateError(f"{name}: {{{{ {value} }}}} is not supported here (only a plain else of an if)")
            node = stack[-1][2]
            stack[-1] = ("else", node.otherwise, node)
        elif keyword == "end":
            if len(stack) == 1:
                raise TemplateError(f"{name}: {{{{ end }}}} without a block")
            block, body, what = stack.pop()
            if block == "define":
                defines[what] = body
        elif keyword == "define":
            if len(stack) != 1:
                raise TemplateError(f"{name}: define inside a block")
            body = []
            stack.append(("define", body, _string(rest.strip(), name)))
        elif keyword in _REFUSED or keyword.startswith("$") or ":=" in value:
            raise TemplateError(
                f"{name}: {{{{ {value} }}}} is outside the supported subset (hack/testbed/helm_render.py)"
            )
        else:
            current.append(_Output(value))
    if len(stack) != 1:
        raise TemplateError(f"{name}: {stack[-1][0]} without {{{{ end }}}}")
    return top, defines


def _string(token: str, where: str) -> str:
    if not (len(token) >= 2 and token[0] == token[-1] == '"'):
        raise TemplateError(f"{where}: expected a quoted string, got {token!r}")
    value = json.loads(token)
    assert isinstance(value, str)
    return value


def go_string(value: Any) -> str:
    """How text/template prints a value (fmt's %v) for the kinds values.yaml holds."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)
    raise TemplateError(f"printing {value!r} directly; use toYaml or toJson")


def _empty(value: Any) -> bool:
    """Go's truth (and Sprig's emptiness): false, 0, nil, empty string/list/map."""
    return value is None or value is False or value == 0 or (isinstance(value, str | list | dict) and not value)


def _indent(width: Any, text: Any) -> str:
    pad = " " * int(width)
    return pad + go_string(text).replace("\n", "\n" + pad)


class _GoQuoting(yaml.SafeDumper):
    """Quotes as Helm's YAML encoder (go-yaml) does: a string that cannot stand plain,
    such as "true", in double quotes, where PyYAML would choose single ones."""

    def choose_scalar_style(self) -> str:
        style: str = super().choose_scalar_style()
        return '"' if style == "'" else style


def _to_yaml(value: Any) -> str:
    # Helm: yaml.Marshal, then one trailing newline removed.
    dumped: str = yaml.dump(value, Dumper=_GoQuoting, default_flow_style=False, sort_keys=True, allow_unicode=True)
    return dumped.removesuffix("\n")


@dataclass
class Chart:
    path: Path
    metadata: dict[str, Any]
    values: dict[str, Any]
    templates: dict[str, str]  # file name under templates/ -> source


def load_chart(path: Path) -> Chart:
    metadata = yaml.safe_load((path / "Chart.yaml").read_text())
    values = yaml.safe_load((path / "values.yaml").read_text()) or {}
    templates = {p.name: p.read_text() for p in sorted((path / "templates").iterdir()) if p.is_file()}
    return Chart(path, metadata, values, templates)


class _Renderer:
    def __init__(self, defines: dict[str, list[_Node]]) -> None:
        self.defines = defines
        self.functions: dict[str, Callable[..., Any]] = {
            "include": self._include,
            "default": lambda default, *given: default if not given or _empty(given[-1]) else given[-1],
            "quote": lambda *args: " ".join(json.dumps(go_string(a), ensure_ascii=False) for a in args),
            "toYaml": _to_yaml,
            "toJson": lambda value: json.dumps(value, separators=(",", ":"), ensure_ascii=False),
            "indent": _indent,
            "nindent": lambda width, text: "\n" + _indent(width, text),
            "dir": lambda path: posixpath.dirname(go_string(path)) or ".",
            "eq": lambda first, *others: all(first == other for other in others),
        }

    def _include(self, name: Any, dot: Any) -> str:
        if name not in self.defines:
            raise TemplateError(f"include {name!r}: no such define (known: {', '.join(sorted(self.defines))})")
        return self.nodes(self.defines[name], dot)

    def nodes(self, nodes: list[_Node], dot: Any) -> str:
        out = []
        for node in nodes:
            if isinstance(node, _Text):
                out.append(node.text)
            elif isinstance(node, _Output):
                out.append(go_string(self.pipeline(node.pipeline, dot)))
            else:
                branch = node.otherwise if _empty(self.pipeline(node.pipeline, dot)) else node.then
                out.append(self.nodes(branch, dot))
        return "".join(out)

    def pipeline(self, text: str, dot: Any) -> Any:
        commands: list[list[str]] = [[]]
        pos = 0
        while pos < len(text.rstrip()):
            match = _TOKEN.match(text, pos)
            if match is None:
                raise TemplateError(f"cannot read {text!r} at {text[pos:]!r}")
            pos = match.end()
            if match.group("pipe"):
                commands.append([])
            else:
                commands[-1].append(match.group("string") or match.group("word"))
        result: Any = _NOTHING
        for command in commands:
            if not command:
                raise TemplateError(f"empty command in {text!r}")
            result = self.command(command, dot, result, text)
        return result

    def command(self, words: list[str], dot: Any, piped: Any, text: str) -> Any:
        head, *rest = words
        if head in self.functions:
            args = [self.argument(w, dot, text) for w in rest]
            if piped is not _NOTHING:
                args.append(piped)
            try:
                return self.functions[head](*args)
            except TypeError as exc:
                raise TemplateError(f"{text!r}: {head}: {exc}") from exc
        if rest or piped is not _NOTHING:
            raise TemplateError(f"{text!r}: {head!r} is not a supported function")
        return self.argument(head, dot, text)

    def argument(self, word: str, dot: Any, text: str) -> Any:
        if word.startswith('"'):
            return _string(word, text)
        if _INT.fullmatch(word):
            return int(word)
        if _FIELD.fullmatch(word):
            value = dot
            for name in word.split(".")[1:] if word != "." else []:
                if not isinstance(value, Mapping) or name not in value:
                    raise TemplateError(f"{text!r}: {word} has no field {name!r}")
                value = value[name]
            return value
        raise TemplateError(f"{text!r}: {word!r} is outside the supported subset (hack/testbed/helm_render.py)")


_NOTHING = object()


def merge_values(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` applied as ``--set a.b=v`` would: dotted keys, maps merged."""
    merged = copy.deepcopy(dict(base))
    for dotted, value in overrides.items():
        *parents, last = dotted.split(".")
        target = merged
        for name in parents:
            target = target.setdefault(name, {})
        target[last] = value
    return merged


def render_chart(
    chart: Chart, *, release: str, namespace: str, values: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """What ``helm template RELEASE CHART -n NAMESPACE --set K=V...`` renders: file name ->
    text, for every template not named ``_*`` (NOTES.txt included)."""
    defines: dict[str, list[_Node]] = {}
    parsed = {}
    for name, source in chart.templates.items():
        nodes, found = _parse(source, name)
        defines.update(found)
        parsed[name] = nodes
    meta = chart.metadata
    dot = {
        "Values": merge_values(chart.values, values or {}),
        "Release": {"Name": release, "Namespace": namespace, "Service": "Helm"},
        "Chart": {"Name": meta["name"], "Version": meta["version"], "AppVersion": meta.get("appVersion", "")},
    }
    renderer = _Renderer(defines)
    return {name: renderer.nodes(nodes, dot) for name, nodes in parsed.items() if not name.startswith("_")}
