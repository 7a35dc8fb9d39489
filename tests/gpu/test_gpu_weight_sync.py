"""The generator's weight receipt while its engine captures a decode graph in another thread (a Ray generator
actor: the engine thread captures lazily, the actor's call thread receives weights): the copy out of the shared
buffers must complete during the capture, and the capture must stay valid."""

import threading

import pytest
import torch

from zeromismatch.orchestration.weight_sync import copy_out

pytestmark = pytest.mark.gpu


def test_copy_out_during_a_capture_in_another_thread():
    dev = torch.device("cuda")
    shared = {torch.bfloat16: torch.randn(1 << 20, device=dev).to(torch.bfloat16),
              torch.float32: torch.randn(1 << 18, device=dev)}
    torch.cuda.synchronize()
    x = torch.ones(1024, device=dev)
    graph, capturing, release, errors = torch.cuda.CUDAGraph(), threading.Event(), threading.Event(), []

    def capture():  # the engine's capture: thread_local, as generator/model_runner.py does
        try:
            side = torch.cuda.Stream(dev)
            with torch.cuda.stream(side):
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    y = x * 2
                    capturing.set()
                    release.wait(30)
                    y.add_(1)
            capture.out = y
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
            capturing.set()

    t = threading.Thread(target=capture)
    t.start()
    assert capturing.wait(30)
    try:
        flat = copy_out(shared, dev)  # while the other thread is inside the capture
    finally:
        release.set()
        t.join()
    assert not errors, errors
    for d, buf in shared.items():
        assert torch.equal(flat[d], buf) and flat[d].data_ptr() != buf.data_ptr()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(capture.out, torch.full_like(x, 3.0))
