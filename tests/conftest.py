import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.hookimpl(trylast=True)  # after pytest's own ordering by fixture
def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` are skipped when torch sees no CUDA device.  Tests marked
    `kills_a_shared_server` run last, in their order: the modules that share the servers
    (`shared_servers`) then need no server started again."""
    import torch

    items.sort(key=lambda item: "kills_a_shared_server" in item.keywords)  # stable: the rest keep their order
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
