"""Shared fixtures: schema registration, the built custom-op library, providers, a seeded rng.

HCFUSE_TEST_INSTALLED_IN=PREFIX makes the run fail unless the hcfuse under test lives below PREFIX
(CI runs the suite against the installed wheel, not a source tree on the path).
"""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest

from hcfuse.checking._session import CPU as CPU_PROVIDER
from hcfuse.checking._session import CUDA as CUDA_PROVIDER
from hcfuse.checking._session import inference_session


def cuda_available() -> bool:
    return CUDA_PROVIDER in ort.get_available_providers()


def pytest_report_header(config):
    import hcfuse

    return f"hcfuse {hcfuse.__version__} from {os.path.dirname(hcfuse.__file__)}"


def pytest_configure(config):
    # registered here, not in pyproject.toml: the suite also runs from a copy of tests/ without it
    config.addinivalue_line("markers", "cuda: needs a CUDA device and onnxruntime-gpu (skipped elsewhere)")
    prefix = os.environ.get("HCFUSE_TEST_INSTALLED_IN")
    if prefix:
        import hcfuse

        where = os.path.realpath(hcfuse.__file__)
        if not where.startswith(os.path.realpath(prefix) + os.sep):
            raise pytest.UsageError(f"HCFUSE_TEST_INSTALLED_IN={prefix}: the tests would import hcfuse from {where}")


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs CUDAExecutionProvider (onnxruntime-gpu and a CUDA device)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def registered_schema():
    """The op's ONNX schema, registered once per run (import hcfuse does it; this makes it explicit)."""
    import onnx

    import hcfuse
    from hcfuse._op import DOMAIN, OP_TYPE, SINCE_VERSION

    hcfuse.register_schema()
    return onnx.defs.get_schema(OP_TYPE, SINCE_VERSION, DOMAIN)


@pytest.fixture(scope="session")
def hcfuse_lib() -> str:
    """Path of the built custom-op library; skips the test when kernels/ was not built."""
    import hcfuse

    try:
        return hcfuse.get_library_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def providers() -> list[str]:
    """Execution providers to test on: CPU, plus CUDA when onnxruntime-gpu sees a device."""
    return [CPU_PROVIDER, *([CUDA_PROVIDER] if cuda_available() else [])]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261130)


@pytest.fixture(scope="session")
def make_session(hcfuse_lib):
    """make_session(model, provider, intra_op_threads=0, **config_entries) -> InferenceSession with the
    library registered and graph optimizations off (it runs exactly the nodes the test built)."""

    def make(model, provider: str = CPU_PROVIDER, intra_op_threads: int = 0, **session_config) -> ort.InferenceSession:
        return inference_session(model, [provider], library=hcfuse_lib, intra_op_threads=intra_op_threads,
                                 config=session_config)

    return make


# ---- differential fuzz of the fusion pass (tests/fusion/test_fuzz_fusion.py) ----------------------------

FUZZ_MUTANTS = 300  # the CI size: well under a minute on a 2-core machine


def pytest_addoption(parser):
    group = parser.getgroup("hcfuse fuzz", "differential fuzz of the fusion pass")
    group.addoption("--fuzz-mutants", type=int, default=None,
                    help=f"mutants the fusion fuzz runs (default ${{HCFUSE_FUZZ_MUTANTS}} or {FUZZ_MUTANTS})")
    group.addoption("--fuzz-seed", type=int, default=None,
                    help="seed of the fusion fuzz (default ${HCFUSE_FUZZ_SEED} or 0)")


def _option_or_env(config, option: str, env: str, default: int) -> int:
    import os

    value = config.getoption(option)
    return int(value if value is not None else os.environ.get(env, default))


@pytest.fixture(scope="session")
def fuzz_mutants(request) -> int:
    return _option_or_env(request.config, "--fuzz-mutants", "HCFUSE_FUZZ_MUTANTS", FUZZ_MUTANTS)


@pytest.fixture(scope="session")
def fuzz_seed(request) -> int:
    return _option_or_env(request.config, "--fuzz-seed", "HCFUSE_FUZZ_SEED", 0)
