"""Device parameters for tests that run on the CPU and, where a GPU is present, on CUDA too."""

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")])
DEVICES = ("cpu", CUDA)
