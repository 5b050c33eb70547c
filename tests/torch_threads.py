"""The embedded trainer's tests run torch on one thread, as ``rlstab demo`` does by default: at these model
sizes a second thread only adds synchronisation, and on a busy machine much more than that."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
