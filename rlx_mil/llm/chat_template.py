"""Chat templates are untrusted code: rendered in jinja2's immutable sandbox, with bounds.

A template comes with a downloaded checkpoint or GGUF file. jinja2's sandbox keeps it away
from Python's internals, but not from looping or building text without end. `BoundedSandbox`
stops a render that runs past `RENDER_SECONDS`, takes more than `MAX_STEPS` steps, builds a
string longer than `MAX_TEXT` characters or a container of more than `MAX_ITEMS` elements
(nested ones counted), or renders more than `MAX_TEXT` characters:

* every loop's iterable, call, attribute or item lookup, filter and intercepted operator is a
  step, and each checks the clock (no thread, no signal: the checks run in the render itself);
* operators, filters and string methods that could make a huge value in one C call
  (`'a' * n`, `x ** n`, `center(n)`, `indent`, `replace`, `join`, `format` widths) are checked
  before they run; what any step returns is measured after;
* list, tuple and dict literals and `~` concatenations are rewritten into checked calls, so no
  structure can grow (by doubling a namespace's value in a loop, say) past the limits;
* `lipsum` (unbounded text by design) is removed; `range` is the sandbox's, its items counted.

A render over a bound raises `ChatTemplateBoundError`, naming the bound.
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes as nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

RENDER_SECONDS = 10.0
MAX_STEPS = 20_000_000
MAX_TEXT = 1 << 24  # characters of one string, or of the rendered text
MAX_ITEMS = 1 << 20  # elements of one container, nested ones included
_MAX_INT_BITS = 1 << 16
_WIDE_FORMAT = re.compile(r"\d{8,}")  # a width or precision of 10^7 characters or more


class ChatTemplateBoundError(Exception):
    """A render went past one of the bounds (time, steps, text, items). Not a TemplateError:
    nothing inside a template can catch it."""


class _Budget:
    def __init__(self) -> None:
        self.deadline = time.monotonic() + RENDER_SECONDS
        self.steps = 0

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise ChatTemplateBoundError(f"the chat template took more than {MAX_STEPS} steps")
        if time.monotonic() > self.deadline:
            raise ChatTemplateBoundError(f"the chat template ran longer than {RENDER_SECONDS:g} s")


_budget: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("chat_template_budget", default=None)


def _active() -> _Budget:
    budget = _budget.get()
    if budget is None:  # a filter folded at compile time: a budget of its own
        budget = _Budget()
        _budget.set(budget)
    return budget


def _refuse(what: str) -> ChatTemplateBoundError:
    return ChatTemplateBoundError(f"the chat template {what}")


def _measured(value: Any) -> Any:
    """`value`, after checking that it holds no string longer than MAX_TEXT characters and no
    more than MAX_ITEMS container elements (shared sub-containers counted each time)."""
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise _refuse(f"built a string of {len(value)} characters (limit {MAX_TEXT})")
        return value
    if not isinstance(value, (list, tuple, dict, set, frozenset)):
        return value
    items, text = 0, 0
    pending: list[Any] = [value]
    while pending:
        current = pending.pop()
        if isinstance(current, str):
            text += len(current)
        elif isinstance(current, (list, tuple, set, frozenset)):
            items += len(current)
            pending.extend(current)
        elif isinstance(current, dict):
            items += len(current)
            pending.extend(current.keys())
            pending.extend(current.values())
        if items > MAX_ITEMS or text > MAX_TEXT:
            raise _refuse(f"built a structure of more than {MAX_ITEMS} elements or {MAX_TEXT} characters")
    return value


def _check_int(value: Any, what: str) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_TEXT:
        raise _refuse(f"passed {value} to {what} (more than {MAX_TEXT})")


def _check_format(text: Any, what: str) -> None:
    if isinstance(text, str) and _WIDE_FORMAT.search(text):
        raise _refuse(f"used a format with a width of 10^7 characters or more in {what}")


def _length(value: Any) -> int:
    return len(value) if isinstance(value, (str, list, tuple)) else 0


def _check_binop(operator: str, left: Any, right: Any) -> None:
    numbers = (int, float)
    if operator == "*":
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(count, int):
                limit = MAX_TEXT if isinstance(seq, str) else MAX_ITEMS
                if len(seq) * max(count, 0) > limit:
                    raise _refuse(f"repeats a sequence of {len(seq)} {count} times (limit {limit})")
        if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > _MAX_INT_BITS:
            raise _refuse(f"multiplies integers of more than {_MAX_INT_BITS} bits")
    elif operator == "**":
        if isinstance(left, numbers) and isinstance(right, int) and abs(left) > 1:
            bits = abs(right) * max(int(abs(left)).bit_length(), 1)
            if bits > _MAX_INT_BITS:
                raise _refuse(f"raises {left} to the power {right}")
    elif operator == "+":
        if _length(left) + _length(right) > MAX_TEXT:
            raise _refuse(f"adds sequences past {MAX_TEXT} elements")
    elif operator == "%" and isinstance(left, str):
        _check_format(left, "'%'")
        for arg in right if isinstance(right, tuple) else (right,):
            _check_int(arg, "'%'")


def _str_method_check(method: Any, args: tuple[Any, ...]) -> None:
    """Checks of the string methods that could build a huge string in one C call."""
    owner = getattr(method, "__self__", None)
    name = getattr(method, "__name__", "")
    wrapped = getattr(method, "__wrapped__", None)  # the sandbox's str.format wrapper
    if wrapped is not None and isinstance(getattr(wrapped, "__self__", None), str):
        _check_format(wrapped.__self__, f"str.{name}")
    if not isinstance(owner, str):
        return
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        grows = (owner.count(args[0]) if args[0] else len(owner) + 1) * max(len(args[1]) - len(args[0]), 0)
        if len(owner) + grows > MAX_TEXT:
            raise _refuse(f"replaces into a string of more than {MAX_TEXT} characters")
    elif name == "join" and args:
        _check_join(owner, args[0])
    elif name == "expandtabs" and args and isinstance(args[0], int):
        if owner.count("\t") * max(args[0], 0) > MAX_TEXT:
            raise _refuse(f"expands tabs past {MAX_TEXT} characters")


def _check_join(separator: str, items: Any) -> None:
    if isinstance(items, (list, tuple)):
        total = len(separator) * len(items) + sum(len(x) for x in items if isinstance(x, str))
        if total > MAX_TEXT:
            raise _refuse(f"joins into a string of more than {MAX_TEXT} characters")


def _bounded_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    passes_arg = getattr(function, "jinja_pass_arg", None) is not None

    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _active().step()
        value, rest = (args[1], args[2:]) if passes_arg else (args[0] if args else None, args[1:])
        for arg in (*rest, *kwargs.values()):
            _check_int(arg, f"the filter {name!r}")
        if name == "format":
            _check_format(value, "the filter 'format'")
        elif name == "indent" and isinstance(value, str):
            width = rest[0] if rest else kwargs.get("width", 4)
            per_line = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
            if (value.count("\n") + 1) * per_line > MAX_TEXT:
                raise _refuse(f"indents past {MAX_TEXT} characters")
        elif name == "replace" and len(rest) >= 2 and isinstance(value, str):
            _str_method_check(value.replace, (str(rest[0]), str(rest[1])))
        elif name == "join":
            value = list(_bounded_items(value))
            args = (*args[:1], value, *args[2:]) if passes_arg else (value, *args[1:])
            _check_join(str(rest[0]) if rest else str(kwargs.get("d", "")), [str(v) for v in value])
        return _measured(function(*args, **kwargs))

    return bounded


def _bounded_items(value: Any) -> Iterator[Any]:
    """The items of a loop's iterable, one step each."""
    budget = _active()
    for item in value if value is not None else ():
        budget.step()
        yield item


def _concat(pieces: list[Any]) -> str:
    """`a ~ b ~ ...`, with each piece measured before it is turned into text."""
    for piece in pieces:
        _measured(piece)
    return _measured("".join(str(piece) for piece in pieces))


def _literal(value: Any) -> Any:
    return _measured(value)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """transformers' chat-template environment (immutable sandbox, trim/lstrip blocks) with the
    bounds of this module."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.globals.pop("lipsum", None)
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}
        self.filters["rlx_bounded_items"] = _bounded_items
        self.filters["rlx_concat"] = _concat
        self.filters["rlx_literal"] = _literal
        self.finalize = _measured

    @staticmethod
    def concat(pieces: Iterable[str]) -> str:
        """The join of a macro's, a `{% set %}` block's or a caller's output, measured first."""
        held = list(pieces)
        size = sum(len(piece) for piece in held)
        if size > MAX_TEXT:
            raise _refuse(f"built a block of {size} characters (limit {MAX_TEXT})")
        return "".join(held)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _active().step()
        _check_binop(operator, left, right)
        return _measured(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _active().step()
        for arg in (*args, *kwargs.values()):
            _check_int(arg, getattr(__obj, "__name__", "a call"))
        _str_method_check(__obj, args)
        return _measured(super().call(__context, __obj, *args, **kwargs))

    def getattr(self, obj: Any, attribute: str) -> Any:
        _active().step()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _active().step()
        return super().getitem(obj, argument)

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        return _rewrite(super()._parse(source, name, filename))


def _checked(node: nodes.Node, filter_name: str) -> nodes.Filter:
    return nodes.Filter(node, filter_name, [], [], None, None, lineno=node.lineno)


def _rewrite(tree: nodes.Template) -> nodes.Template:
    """Loops iterate through a counting filter; `~`, list, tuple and dict literals go through
    measuring ones."""
    for loop in tree.find_all(nodes.For):
        loop.iter = _checked(loop.iter, "rlx_bounded_items")
    _replace_expressions(tree)
    return tree


def _replace_expressions(node: nodes.Node) -> None:
    for field, value in node.iter_fields():
        if isinstance(value, list):
            setattr(node, field, [_wrapped(v) if isinstance(v, nodes.Node) else v for v in value])
            for v in value:
                if isinstance(v, nodes.Node):
                    _replace_expressions(v)
        elif isinstance(value, nodes.Node):
            _replace_expressions(value)
            setattr(node, field, _wrapped(value))


def _wrapped(node: nodes.Node) -> nodes.Node:
    if isinstance(node, nodes.Concat):
        return _checked(nodes.List(list(node.nodes), lineno=node.lineno), "rlx_concat")
    if isinstance(node, (nodes.List, nodes.Dict)) or (isinstance(node, nodes.Tuple) and node.ctx == "load"):
        return _checked(node, "rlx_literal")
    return node


def compile_bounded(source: str) -> jinja2.Template:
    """`source` compiled in a BoundedSandbox with transformers' chat-template extras:
    `raise_exception`, a non-escaping `tojson`, `strftime_now`, `loopcontrols` and
    `{% generation %}` blocks. jinja2.TemplateError when `source` is not a valid template."""

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` (assistant-mask markers): renders the body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        _measured(value)
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        _check_format(format, "strftime_now")
        return datetime.now().strftime(format[:256])

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _bounded_filter("tojson", tojson)
    return env.from_string(source, globals={"raise_exception": raise_exception, "strftime_now": strftime_now})


def render_bounded(template: jinja2.Template, variables: Mapping[str, Any]) -> str:
    """The template's text for `variables`, within the bounds (ChatTemplateBoundError past
    one; jinja2 and Python errors the template raises pass through)."""
    token = _budget.set(_Budget())
    try:
        pieces: list[str] = []
        size = 0
        for piece in _pieces(template, variables):
            size += len(piece)
            if size > MAX_TEXT:
                raise _refuse(f"rendered more than {MAX_TEXT} characters")
            pieces.append(piece)
        return "".join(pieces)
    finally:
        _budget.reset(token)


def _pieces(template: jinja2.Template, variables: Mapping[str, Any]) -> Iterable[str]:
    budget = _active()
    for piece in template.generate(**variables):
        budget.step()
        yield piece
