"""onnxscript's private rewriter API, as hcfuse.rewrite._onnxscript_api takes it: every name and private
method must be where the adapter looks for it in the installed onnxscript, and a moved one is named."""

from __future__ import annotations

import pytest
from onnxscript.rewriter import pattern as public_pattern

from hcfuse.rewrite import _onnxscript_api as api

_CLASSES = sorted(name for name in api.LOCATIONS if name[0].isupper())


def test_adapter_exports_every_name_it_locates():
    assert set(api.LOCATIONS) | {"rule_matcher"} == set(api.__all__)


@pytest.mark.parametrize("name", sorted(api.LOCATIONS))
def test_symbol_is_where_the_adapter_looks(name):
    try:
        found = api.resolve(name, api.LOCATIONS[name])
    except ImportError as error:
        pytest.fail(f"{name}: {error}")
    assert found is getattr(api, name), f"{name}: the adapter exports another object than it finds"


@pytest.mark.parametrize("class_name", sorted(api.PRIVATE_METHODS))
def test_private_methods_keep_their_parameters(class_name):
    missing = api.missing_private_methods(getattr(api, class_name), api.PRIVATE_METHODS[class_name])
    assert not missing, f"onnxscript {api.onnxscript_version()} changed {', '.join(missing)}"


@pytest.mark.parametrize("name", [n for n in _CLASSES if hasattr(public_pattern, n)])
def test_symbol_is_the_one_onnxscript_rewrite_uses(name):
    # rules built from the adapter's classes must be the classes onnxscript.rewriter.rewrite() accepts
    assert getattr(api, name) is getattr(public_pattern, name)


def test_moved_symbol_is_named_with_places_and_version():
    places = ("onnxscript.rewriter._basics", "onnxscript.rewriter.no_such_module")
    with pytest.raises(ImportError) as raised:
        api.resolve("NoSuchSymbol", places)
    message = str(raised.value)
    assert "NoSuchSymbol" in message
    assert "onnxscript.rewriter._basics, onnxscript.rewriter.no_such_module" in message
    assert f"onnxscript {api.onnxscript_version()} " in message
    assert api.onnxscript_version() != "unknown"


def test_changed_private_method_is_named():
    class Matcher:
        def _init_match(self, level):  # renamed parameter
            pass

    missing = api.missing_private_methods(Matcher, {"_init_match": ("verbose",), "_gone": ("x",)})
    assert missing == ["Matcher._init_match(verbose)", "Matcher._gone(x)"]


def test_rule_matcher_is_the_rules_pattern_matcher():
    from hcfuse.rewrite import hc_lowrank_mix_rules
    from hcfuse.rewrite._local_matcher import LocalMatcher

    assert all(isinstance(api.rule_matcher(rule), LocalMatcher) for rule in hc_lowrank_mix_rules)
