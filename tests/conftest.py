import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` are skipped when torch sees no CUDA device."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_servers():
    """The server pairs that the SGLang backend modules share (`sglang_helpers.SharedServers`),
    stopped when the session ends."""
    from sglang_helpers import SharedServers

    shared = SharedServers()
    try:
        yield shared
    finally:
        shared.close()
