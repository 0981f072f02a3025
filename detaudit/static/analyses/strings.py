"""String-ness: whether an expression visibly evaluates to a string, or iterates strings.

Sets of ints (and other numbers) iterate in a fixed order for a fixed insertion
order: CPython hashes them to themselves.  Only ``str``/``bytes`` hashes are
salted per process, so rules that care about hash order (set-iteration-order,
``hash()`` seeds in entropy-seed) ask whether values are *syntactically*
strings: literals, f-strings, results of ``str`` methods and functions, words of
``split()``, loop variables over such words, names assigned a known string.
"""

from __future__ import annotations

import libcst as cst

from detaudit.static.engine.facts import FileFacts

#: String methods whose result is a ``str`` / a list of ``str``.
STRING_METHODS = frozenset(
    {"lower", "upper", "strip", "lstrip", "rstrip", "replace", "format", "join", "title",
     "casefold", "capitalize", "decode", "encode", "removeprefix", "removesuffix", "zfill"}
)
STRING_LIST_METHODS = frozenset({"split", "rsplit", "splitlines", "readlines"})
STRING_FUNCTIONS = frozenset(
    {"str", "repr", "os.path.basename", "os.path.join", "os.path.dirname", "os.fspath"}
)
STRING_LIST_FUNCTIONS = frozenset({"re.findall", "re.split", "os.listdir"})


def is_string_expression(node: cst.BaseExpression, facts: FileFacts, string_names: frozenset[str] = frozenset()) -> bool:
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)):
        return True
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Modulo)):
        return is_string_expression(node.left, facts, string_names)
    if isinstance(node, cst.Call):
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in STRING_METHODS:
            return True
        return facts.names.resolve(node.func) in STRING_FUNCTIONS
    if isinstance(node, cst.Name):
        if node.value in string_names:
            return True
        value = facts.evaluate(node)
        return value.known and isinstance(value.value, (str, bytes))
    return False


def is_string_iterable(node: cst.BaseExpression, facts: FileFacts, string_names: frozenset[str] = frozenset()) -> bool:
    """Iterating ``node`` yields strings."""
    if isinstance(node, (cst.List, cst.Tuple, cst.Set)):
        elements = node.elements
        return bool(elements) and all(
            isinstance(e, cst.Element) and is_string_expression(e.value, facts, string_names) for e in elements
        )
    if isinstance(node, (cst.ListComp, cst.GeneratorExp, cst.SetComp)):
        return _comprehension_yields_strings(node, facts, string_names)
    if isinstance(node, cst.Call):
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in STRING_LIST_METHODS:
            return True
        callee = facts.names.resolve(node.func)
        if callee in STRING_LIST_FUNCTIONS:
            return True
        if callee in ("set", "frozenset", "list", "tuple", "sorted") and len(node.args) == 1:
            return is_string_iterable(node.args[0].value, facts, string_names)
    return is_string_expression(node, facts, string_names)  # the characters of a string


def _comprehension_yields_strings(node, facts: FileFacts, string_names: frozenset[str]) -> bool:
    names = set(string_names)
    loop = node.for_in
    while loop is not None:
        if isinstance(loop.target, cst.Name) and is_string_iterable(loop.iter, facts, frozenset(names)):
            names.add(loop.target.value)
        loop = loop.inner_for_in
    return is_string_expression(node.elt, facts, frozenset(names))


def is_string_set(node: cst.BaseExpression, facts: FileFacts, string_names: frozenset[str] = frozenset()) -> bool:
    if isinstance(node, cst.Set):
        return is_string_iterable(node, facts, string_names)
    if isinstance(node, cst.SetComp):
        return _comprehension_yields_strings(node, facts, string_names)
    if isinstance(node, cst.Call) and len(node.args) == 1 and node.args[0].keyword is None:
        if facts.names.resolve(node.func) in ("set", "frozenset"):
            return is_string_iterable(node.args[0].value, facts, string_names)
    return False
