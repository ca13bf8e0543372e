"""What the GPU path decides, checked where CI runs (no GPU): the tensor backend when ranks
share GPUs, host staging's pass-through and accounting, and where NCCL is refused. The GPU
itself is exercised by tests/test_gpu.py on a GPU machine."""

import os
import subprocess
import sys

import pytest
import torch

from runner.comm.communicator import HostStaging, tensor_backend
from runner.errors import UserError

from conftest import REPO, run_cli


@pytest.mark.parametrize("requested,device,ranks,gpus,chosen", [
    ("auto", "cpu", 4, 0, "mpi"),
    ("auto", "cuda", 8, 8, "nccl"),   # a GPU per rank
    ("auto", "cuda", 4, 8, "nccl"),
    ("auto", "cuda", 2, 1, "mpi"),    # two ranks on one GPU: NCCL would refuse
    ("auto", "cuda", 16, 8, "mpi"),
    ("mpi", "cuda", 2, 2, "mpi"),     # asked for: staged through host memory
    ("nccl", "cuda", 8, 8, "nccl"),
    ("gloo", "cpu", 2, 0, "gloo"),
])
def test_backend_for_ranks_and_gpus(requested, device, ranks, gpus, chosen):
    assert tensor_backend(requested, device, ranks, gpus) == chosen


@pytest.mark.parametrize("requested,device,ranks,gpus,line", [
    ("nccl", "cpu", 2, 0, "comm.backend=nccl needs GPUs. Fix: use comm.backend=auto on CPU"),
    ("nccl", "cuda", 4, 1, "comm.backend=nccl needs a GPU per rank, but 4 ranks share 1 GPU(s) "
     "on one machine (NCCL refuses two ranks on one device). Fix: use comm.backend=auto (MPI "
     "through pinned host memory), or at most one rank per GPU"),
    ("gloo", "cuda", 2, 2, "comm.backend=gloo moves CPU tensors, and the model is on a GPU. "
     "Fix: use comm.backend=auto (NCCL, or MPI through pinned host memory)"),
])
def test_backends_that_cannot_work_are_one_line(requested, device, ranks, gpus, line):
    with pytest.raises(UserError) as error:
        tensor_backend(requested, device, ranks, gpus)
    assert str(error.value) == line


def test_host_staging_passes_cpu_tensors_through_uncounted():
    staging = HostStaging()
    tensor = torch.arange(6, dtype=torch.float32)
    with staging.host(tensor) as host:
        host[:] *= 2  # MPI writes into the tensor's own memory
    assert torch.equal(tensor, 2 * torch.arange(6, dtype=torch.float32))
    assert (staging.seconds, staging.bytes) == (0.0, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU machine's line is checked by "
                    "tests/test_gpu.py")
@pytest.mark.slow
def test_nccl_on_a_machine_without_gpus_ends_before_anything_starts(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(["recipe=digit_images", "algo=ssgd", "launcher.nprocs=2",
                    "comm.backend=nccl", f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                   check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "adpsgd-run: error: comm.backend: nccl needs GPUs and this machine has none. Fix: "
        "comm.backend=auto"]
    assert not run_dir.exists()


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the script runs")
def test_gpu_check_on_a_machine_without_gpus_says_so_in_one_line(tmp_path):
    for args, env in (([str(tmp_path / "out")], {}), ([], {"OUT": str(tmp_path / "out")})):
        proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), *args],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHON": sys.executable, **env})
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        assert proc.stdout.splitlines() == [
            f"gpu_check: no CUDA GPU is visible to {sys.executable} (torch.cuda.is_available() "
            "is False): nothing to check here; run it on a GPU machine"]
    assert not (tmp_path / "out").exists()


def test_every_benchmark_command_of_gpu_check_parses_here():
    """scripts/gpu_check.sh runs only on a GPU machine, where a wrong option costs device
    time: each benchmark call in it (its array variables expanded, other variables given
    placeholder values) must parse with the benchmark's own argument parser."""
    import importlib.util
    import re
    import shlex

    text = (REPO / "scripts" / "gpu_check.sh").read_text().replace("\\\n", " ")
    arrays = dict(re.findall(r"^\s*(\w+)=\((.*)\)\s*$", text, flags=re.M))
    checked = 0
    for name, rest in re.findall(r'"\$PY" benchmarks/(bench_\w+)\.py(.*)', text):
        for array, words in arrays.items():
            rest = rest.replace(f'"${{{array}[@]}}"', words)
        rest = rest.replace('"$@"', "")  # e2e()'s own arguments are its callers' (below)
        words = shlex.split(re.sub(r"\$\{?\w+\}?", "1", rest.split(";")[0]))
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.parse_args(words)
        checked += 1
    for words in re.findall(r"^\s*e2e \w+(.*)$", text, flags=re.M):  # calls of e2e()
        for array, value in arrays.items():
            words = words.replace(f'"${{{array}[@]}}"', value)
        words = re.sub(r"\$\{?\w+\}?", "1", words)
        bench = importlib.util.spec_from_file_location("b", REPO / "benchmarks" /
                                                       "bench_imagenet.py")
        module = importlib.util.module_from_spec(bench)
        bench.loader.exec_module(module)
        module.parse_args([*shlex.split(arrays["E2E"]), *shlex.split(words)])
        checked += 1
    assert checked >= 10
