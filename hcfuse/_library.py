"""Locating the bundled custom-op library and registering it with ONNX Runtime."""

from __future__ import annotations

import importlib.resources
import os
import sys

from hcfuse._op import DOMAIN, OP_TYPE, SINCE_VERSION

_LIB_NAMES = {"linux": "libhcfuse_ops.so", "darwin": "libhcfuse_ops.dylib", "win32": "hcfuse_ops.dll"}


def library_file_name() -> str:
    """The library's file name on this platform (libhcfuse_ops.so on Linux)."""
    return _LIB_NAMES.get(sys.platform, "libhcfuse_ops.so")


def get_library_path() -> str:
    """Path of the hcfuse_ops shared library (CPU kernels, plus CUDA kernels when built with them).

    ``HCFUSE_LIBRARY`` overrides the bundled copy (e.g. a debug build).
    """
    override = os.environ.get("HCFUSE_LIBRARY")
    if override:
        if not os.path.isfile(override):
            raise FileNotFoundError(f"HCFUSE_LIBRARY={override!r} is not a file")
        return override
    name = library_file_name()
    path = importlib.resources.files("hcfuse") / "lib" / name
    if not path.is_file():
        raise FileNotFoundError(
            f"hcfuse kernels were not built: {name} is not in {path.parent}. "
            "Install with `pip install -e .` (it compiles kernels/ with CMake), or set HCFUSE_LIBRARY."
        )
    return str(path)


# The session config entry through which a SessionOptions records the hcfuse library registered on it:
# ORT keeps no list of registered libraries that Python can read, and a second registration of the
# com.microsoft custom-op domain fails every session made from those options.
REGISTERED_CONFIG_KEY = "hcfuse.custom_ops_library"

# The metadata_props key of a fused model that says where its kernels come from.
METADATA_KEY = "hcfuse.library"


def registered_library(session_options) -> str | None:
    """The hcfuse library path hcfuse.register recorded on session_options, or None."""
    try:
        return session_options.get_session_config_entry(REGISTERED_CONFIG_KEY) or None
    except RuntimeError:  # onnxruntime's answer for a key that was never set
        return None


def register(session_options=None):
    """Registers the custom-op library with an onnxruntime.SessionOptions and returns it.

    With no argument a new SessionOptions is made, as onnxruntime-extensions users expect. A second
    call on the same options does nothing (they record the library in a session config entry); one
    naming another library file (HCFUSE_LIBRARY changed) raises, since both would add com.microsoft.
    Options given the library by register_custom_ops_library itself carry no record: use one or the other.
    """
    import onnxruntime as ort

    if session_options is None:
        session_options = ort.SessionOptions()
    path = get_library_path()
    already = registered_library(session_options)
    if already is not None:
        if os.path.realpath(already) != os.path.realpath(path):
            raise ValueError(f"hcfuse.register: these SessionOptions already have hcfuse's library {already!r}; "
                             f"registering {path!r} too would add the com.microsoft custom-op domain twice")
        return session_options
    session_options.register_custom_ops_library(path)
    session_options.add_session_config_entry(REGISTERED_CONFIG_KEY, path)
    return session_options


def kernel_source_metadata() -> dict[str, str]:
    """The metadata_props entry a fused model carries: where its kernels come from and what to do."""
    from hcfuse import __version__
    return {METADATA_KEY: f"{DOMAIN}::{OP_TYPE} runs on the kernels of hcfuse {__version__}'s custom-op library: "
                          "install hcfuse, then call hcfuse.register(session_options) before creating the session "
                          "(onnxruntime-genai: session_options.custom_ops_library in genai_config.json)"}


# How onnxruntime says that no kernel (1.32: no implementation; 1.31 and older: no schema either) runs
# the fused node.
_MISSING_KERNEL_SIGNS = ("Could not find an implementation for", "Kernel not found", "is not a registered function/op")


def missing_library_message(error: BaseException, registered: str | None = None) -> str | None:
    """One line saying what to do when error is onnxruntime failing a session on the fused node for want
    of its kernel; None for any other error. registered: the hcfuse library the session options carry
    (registered_library), if any."""
    text = " ".join(str(error).split())
    if OP_TYPE not in text or not any(sign in text for sign in _MISSING_KERNEL_SIGNS):
        return None
    if registered is None:
        return (f"onnxruntime has no kernel for {DOMAIN}::{OP_TYPE} ({text}); its kernels are in hcfuse's custom-op "
                "library: call hcfuse.register(session_options) before creating the session")
    return (f"onnxruntime has no kernel for {DOMAIN}::{OP_TYPE} ({text}) although hcfuse's library {registered} is "
            "registered: it runs on CPUExecutionProvider, and on CUDAExecutionProvider only when built with its "
            "CUDA kernels (pip install with a CUDA toolkit present, see the README)")


def has_contrib_opset_import(model) -> bool:
    """Whether an onnx.ModelProto imports the com.microsoft opset.

    A model without it loads with com.microsoft at the highest version any registered schema set claims:
    1000 once a custom-op library adds com.microsoft (onnxruntime gives every custom domain 1 to 1000),
    a version at which onnxruntime finds none of its own com.microsoft schemas; the ops its optimizer
    writes there (FusedMatMul, FusedGemm, Gelu, BiasGelu, QuickGelu, SkipLayerNormalization, ...) then
    fail the session. Importing com.microsoft at 1 keeps them loading.
    """
    return any(o.domain == DOMAIN for o in model.opset_import)


def add_contrib_opset_import(model) -> bool:
    """Adds com.microsoft version 1 to an onnx.ModelProto's opset imports when missing (see
    has_contrib_opset_import); returns whether it did."""
    if has_contrib_opset_import(model):
        return False
    entry = model.opset_import.add()
    entry.domain, entry.version = DOMAIN, SINCE_VERSION
    return True
