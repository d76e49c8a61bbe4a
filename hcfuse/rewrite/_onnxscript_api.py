"""The parts of onnxscript's rewriter that hcfuse uses and onnxscript does not promise to keep.

Every name hcfuse takes from onnxscript's private modules (``onnxscript.rewriter._basics``,
``_matcher``, ``_pattern_ir``, ``_rewrite_rule``, ...) is imported here and nowhere else. Each name is
looked for in its places in order (the public ``onnxscript.rewriter.pattern`` first where it is
re-exported there); the private methods that the local matchers override or call are checked by name
and parameters. A release that moved or changed any of them fails at import with one line that names
what is missing, where it was looked for, and the onnxscript version, instead of an AttributeError
deep inside a rewrite.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect

_PATTERN = "onnxscript.rewriter.pattern"
_BASICS = "onnxscript.rewriter._basics"
_MATCHER = "onnxscript.rewriter._matcher"
_PATTERN_IR = "onnxscript.rewriter._pattern_ir"
_REWRITE_RULE = "onnxscript.rewriter._rewrite_rule"

# name -> the modules it is looked for in, in order
LOCATIONS: dict[str, tuple[str, ...]] = {
    "AttrVar": (_PATTERN, _PATTERN_IR),
    "MatchFailureError": (_BASICS,),
    "MatchResult": (_PATTERN, _BASICS),
    "MatchingTracer": (_PATTERN, _BASICS),
    "RewriteRule": (_PATTERN, _REWRITE_RULE),
    "RewriteRuleClassBase": (_PATTERN, _REWRITE_RULE),
    "RewriteRuleSet": (_PATTERN, _REWRITE_RULE),
    "SimplePatternMatcher": (_PATTERN, _MATCHER),
}

# class name -> {private method: the parameters hcfuse passes it (by name or position)}
PRIVATE_METHODS: dict[str, dict[str, tuple[str, ...]]] = {
    "SimplePatternMatcher": {
        "_init_match": ("verbose",),
        "_match_single_output_node": ("model", "graph_or_function", "node", "check_removable"),
        "_multi_match": ("candidate", "check_removable"),
    },
}


def onnxscript_version() -> str:
    try:
        return importlib.metadata.version("onnxscript")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def resolve(name: str, places: tuple[str, ...]):
    """The object called name in the first of places that has it; ImportError naming all three if none does."""
    for place in places:
        try:
            module = importlib.import_module(place)
        except ImportError:
            continue
        if hasattr(module, name):
            return getattr(module, name)
    raise ImportError(f"onnxscript {onnxscript_version()} has no {name} (looked in {', '.join(places)}); "
                      f"hcfuse.rewrite needs a release it supports (see the pin in pyproject.toml)")


def missing_private_methods(cls: type, methods: dict[str, tuple[str, ...]]) -> list[str]:
    """'Class.method(params)' for each method of methods that cls lacks or that takes other parameters."""
    missing = []
    for method, params in methods.items():
        function = getattr(cls, method, None)
        taken = list(inspect.signature(function).parameters)[1:] if callable(function) else None
        if taken is None or taken[:len(params)] != list(params):
            missing.append(f"{cls.__name__}.{method}({', '.join(params)})")
    return missing


def _load() -> dict[str, object]:
    found, errors = {}, []
    for name, places in LOCATIONS.items():
        try:
            found[name] = resolve(name, places)
        except ImportError as error:
            errors.append(str(error))
    for class_name, methods in PRIVATE_METHODS.items():
        if class_name in found:
            missing = missing_private_methods(found[class_name], methods)
            if missing:
                errors.append(f"onnxscript {onnxscript_version()} has no {'; '.join(missing)} "
                              f"(private methods that hcfuse.rewrite's matchers use)")
    if errors:
        raise ImportError(" | ".join(errors))
    return found


_found = _load()
AttrVar = _found["AttrVar"]
MatchFailureError = _found["MatchFailureError"]
MatchResult = _found["MatchResult"]
MatchingTracer = _found["MatchingTracer"]
RewriteRule = _found["RewriteRule"]
RewriteRuleClassBase = _found["RewriteRuleClassBase"]
RewriteRuleSet = _found["RewriteRuleSet"]
SimplePatternMatcher = _found["SimplePatternMatcher"]
del _found


def rule_matcher(rule):
    """The pattern matcher a RewriteRule was built with (onnxscript keeps it in a private attribute)."""
    try:
        return rule._matcher
    except AttributeError:
        raise AttributeError(f"onnxscript {onnxscript_version()}: RewriteRule {rule.name!r} has no _matcher "
                             f"(the private attribute that holds its pattern matcher)") from None


__all__ = [
    "AttrVar",
    "MatchFailureError",
    "MatchResult",
    "MatchingTracer",
    "RewriteRule",
    "RewriteRuleClassBase",
    "RewriteRuleSet",
    "SimplePatternMatcher",
    "rule_matcher",
]
