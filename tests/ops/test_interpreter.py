"""zeromismatch.ops.interpreter's bounds checker (needs triton: the `interpret` extra): it must fail an access that
leaves every argument's storage, name the kernel and the argument, and pass masked-off lanes; then the engine's
randomized multi-turn workload and the trainer's step run with every kernel interpreted and checked
(experiments/gpu/bounds_check.py, in a subprocess: TRITON_INTERPRET must be set before zeromismatch is imported)."""

import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def copy_kernel():
    """A copy kernel whose mask is the argument `bound` (offs < bound): bound = n + 1 is the off-by-one."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs compiled kernels; the checker is for the interpreter")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")  # read when a kernel is decorated and at launch
        triton = pytest.importorskip("triton")
        import triton.language as tl

        from zeromismatch.ops import interpreter

        @triton.jit
        def copy(src, dst, bound, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(dst + offs, tl.load(src + offs, mask=offs < bound), mask=offs < bound)

        yield copy, interpreter


def test_in_bounds_and_masked_off_accesses_pass(copy_kernel):
    copy, interpreter = copy_kernel
    src, dst = torch.arange(10, dtype=torch.float32), torch.zeros(10)
    with interpreter.check_bounds():
        copy[(2,)](src, dst, 10, BLOCK=8)  # lanes 10..15 of the second program point past both: masked off
    assert torch.equal(src, dst)


def test_an_off_by_one_load_names_the_kernel_and_the_argument(copy_kernel):
    copy, interpreter = copy_kernel
    src, dst = torch.arange(16, dtype=torch.float32)[:10], torch.zeros(11)
    # a view: the storage of src (16 floats) bounds it, as an allocation does on a GPU
    with interpreter.check_bounds():
        copy[(2,)](src, dst, 11, BLOCK=8)  # reads src's storage at index 10: inside it, no fault
        with pytest.raises(interpreter.OutOfBounds, match=r"copy program \(1, 0, 0\): load of 1 4-byte .*past the end of src"):
            copy[(2,)](torch.arange(10, dtype=torch.float32), dst, 11, BLOCK=8)


def test_an_out_of_bounds_store_is_caught_before_it_writes(copy_kernel):
    copy, interpreter = copy_kernel
    src, dst = torch.arange(12, dtype=torch.float32), torch.zeros(12)
    original = interpreter.interp.InterpreterBuilder.create_masked_store
    with interpreter.check_bounds():
        with pytest.raises(interpreter.OutOfBounds, match=r"store of 4 4-byte elements .*0 elements past the end of dst"):
            copy[(2,)](src, dst[:8].clone(), 12, BLOCK=8)
    assert interpreter.interp.InterpreterBuilder.create_masked_store is original  # unpatched on exit


@pytest.mark.slow
def test_engine_workload_and_trainer_step_stay_in_bounds():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.path.join(ROOT, "src"), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "gpu", "bounds_check.py"), "--seeds", "0",
                        "--iterations", "40"], env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    lines = r.stdout.splitlines()
    assert sum("accesses in bounds" in ln for ln in lines) == 2 and sum("trainer" in ln for ln in lines) == 2, lines
