"""The CUDA path on a real GPU: the compute path (bf16 autocast, channels-last, torch.compile,
pinned-memory loading), NCCL, host staging of GPU tensors when ranks share a GPU, and both
GPU recipes trained end to end with SSGD and AD-PSGD on one rank and on ranks sharing one GPU,
elastic jobs that lose a learner and take in a spare with every model on the GPU, and exchanges
in bfloat16 from GPU models.

Every test here carries the ``gpu`` marker and is skipped, with the reason, where no CUDA GPU
is visible (conftest.py); ``make test-gpu`` runs them on a GPU machine. The decisions they
rely on (the backend for shared GPUs, the staging code, the NCCL refusal) are also checked on
CPU by tests/test_gpu_decisions.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_compute_path import PassThrough, SmallNet
from test_elastic import DIGITS as ELASTIC_DIGITS
from test_elastic import assert_every_sample_once, learners_alive
from test_speech_e2e import SMALL as SPEECH

from recipes.imagenet.synthetic import write_fake_imagenet
from runner.algos.choco import COMPRESSIONS, ChocoConfig, compress, decode, draws
from runner.comm.buffers import flatten_parameters
from runner.launch.local import threads_per_process
from runner.train.compute_path import ComputePath
from runner.train.data import BatchFetcher

from conftest import read_run, run_cli, run_mpi

pytestmark = [pytest.mark.gpu, pytest.mark.resource("gpu")]

CUDA = torch.device("cuda", 0)
CLASSES = 8
IMAGENET = ["recipe=imagenet", "recipe.model.arch=resnet18", "recipe.image_size=32",
            "trainer.batch_size=16", "trainer.eval_batch_size=32", "trainer.epochs=3",
            "trainer.progress=false"]


def test_bf16_autocast_and_channels_last_step_on_cuda_keeps_float32_flat_gradients():
    torch.manual_seed(0)
    model = SmallNet().to(CUDA)
    flat = flatten_parameters(model.parameters())
    path = ComputePath(device=CUDA, amp=torch.bfloat16, channels_last=True)
    host = (torch.randn(4, 3, 8, 8).pin_memory(), torch.tensor([0, 1, 2, 0]).pin_memory())
    images, labels = path.batch(PassThrough(), host)
    assert images.is_cuda and images.is_contiguous(memory_format=torch.channels_last)
    dtypes = {}
    model.fc.register_forward_hook(lambda module, args, out: dtypes.update(fc=out.dtype))
    with path.autocast():
        out = model(images)  # ends in a LayerNorm, which autocast runs in float32
        loss = torch.nn.functional.cross_entropy(out.float(), labels)
    assert dtypes["fc"] == torch.bfloat16  # the linear layer ran in bf16
    loss.backward()
    assert torch.isfinite(loss)
    for p in model.parameters():
        assert p.is_cuda and p.dtype == torch.float32 and p.grad.dtype == torch.float32
    assert all(b.is_cuda for b in flat)


def test_compiled_model_on_cuda_matches_eager():
    torch.manual_seed(0)
    eager = SmallNet().to(CUDA)
    path = ComputePath(device=CUDA, compile=True, compile_backend="inductor")
    compiled = path.copy_model(eager)
    path.prepare_model(compiled)
    x = torch.randn(8, 3, 8, 8, device=CUDA)
    torch.testing.assert_close(compiled(x), eager(x), rtol=1e-4, atol=1e-4)
    assert compiled._compiled_call_impl is not None


def test_pinned_loader_batches_reach_the_gpu_unchanged():
    data = torch.utils.data.TensorDataset(torch.arange(64, dtype=torch.float32).view(16, 4))
    fetcher = BatchFetcher(data, torch.utils.data.default_collate, num_workers=2,
                           pin_memory=True)
    batches = [torch.arange(i, i + 4) for i in range(0, 16, 4)]
    for idx, batch in zip(batches, fetcher.iterate([b.numpy() for b in batches])):
        (rows,) = batch
        assert rows.is_pinned()
        on_gpu = rows.to(CUDA, non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(on_gpu.cpu(), data.tensors[0][idx])


def test_nccl_allreduce_on_one_rank():
    """NCCL where one GPU allows it: a one-rank group (a second rank would share the device)."""
    import torch.distributed as dist

    from runner.comm.communicator import init_torch_distributed, shutdown_torch_distributed
    from runner.comm.world import mpi

    assert init_torch_distributed(mpi().COMM_SELF, "nccl")
    try:
        t = torch.full((1000,), 3.0, device=CUDA)
        dist.all_reduce(t)
        assert torch.equal(t, torch.full_like(t, 3.0))
        assert dist.get_backend() == "nccl"
    finally:
        shutdown_torch_distributed()


@pytest.mark.mpi
def test_two_ranks_sharing_the_gpu_stage_collectives_and_gossip_through_host_memory():
    proc = run_mpi(2, "gpu_staging.py", timeout=300)
    lines = [line for line in proc.stdout.splitlines() if "staged at" in line]
    assert len(lines) == 2, proc.stdout
    print("\n".join(lines))


@pytest.mark.mpi
def test_nccl_with_ranks_sharing_the_gpu_ends_with_one_line_before_ranks_start(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(["recipe=digit_images", "algo=ssgd", "launcher.nprocs=2",
                    "comm.backend=nccl", f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                   check=False)
    gpus = torch.cuda.device_count()
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"adpsgd-run: error: comm.backend: nccl needs a GPU per rank, but 2 ranks share {gpus} "
        "GPU(s) on one machine (NCCL refuses two ranks on one device). Fix: use "
        "comm.backend=auto (MPI through pinned host memory), or at most one rank per GPU"]
    assert not run_dir.exists()


@pytest.fixture(scope="module")
def fake_imagenet(tmp_path_factory):
    root = tmp_path_factory.mktemp("imagenet")
    write_fake_imagenet(root, classes=CLASSES, train_per_class=23, val_per_class=6, size=40)
    return root


@pytest.fixture(scope="module")
def speech_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("speech-cache")


CASES = [(recipe, algo, nprocs) for recipe in ("spoken_digits", "imagenet")
         for algo, nprocs in (("ssgd", 1), ("ssgd", 2), ("adpsgd", 2), ("adpsgd", 4))]


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("recipe,algo,nprocs", CASES, ids=[f"{r}-{a}-{n}" for r, a, n in CASES])
def test_recipe_trains_on_the_gpu(recipe, algo, nprocs, fake_imagenet, speech_cache, tmp_path):
    run_dir = tmp_path / "run"
    # 5 epochs, as measured on the H100 and H200 (the CPU test runs 4: tests/test_speech_e2e.py)
    data = ([*SPEECH, "trainer.epochs=5", f"recipe.data.cache_dir={speech_cache}"]
            if recipe == "spoken_digits"
            else [*IMAGENET, f"recipe.data.root={fake_imagenet}"])
    if recipe == "spoken_digits" and algo == "adpsgd":
        # AD-PSGD needs more, smaller steps here: batches of 16 for 5 epochs left a WER of 61
        # (2 ranks) and 92 (4 ranks) on CPU; batches of 8 for 8 epochs reach 28 on 4 ranks.
        data += ["trainer.batch_size=8", "trainer.epochs=8"]
    run_cli([*data, f"algo={algo}", f"launcher.nprocs={nprocs}", f"hydra.run.dir={run_dir}"],
            cwd=tmp_path, timeout=900,
            env={"OMP_NUM_THREADS": str(threads_per_process(nprocs))})
    metrics, summary = read_run(run_dir)
    print(json.dumps({"case": f"{recipe}-{algo}-{nprocs}", "metrics": metrics,
                      "samples_per_s": summary.get("samples_per_s"),
                      "devices": summary["devices"], "comm_backend": summary["comm_backend"],
                      "comm_staging": summary.get("comm_staging"),
                      "algo_stats": summary["algo_stats"]}))
    assert summary["status"] == "completed" and summary["nprocs"] == nprocs
    assert len(summary["devices"]) == nprocs
    assert all(device.startswith("cuda:0 (") for device in summary["devices"]), summary
    assert summary["comm_backend"] == ("nccl" if nprocs == 1 else "mpi")
    if algo == "adpsgd":  # the gossip staged the GPU model through host memory
        assert all(v > 0 for v in summary["algo_stats"]["staging_ms_per_mb"]), summary
    elif nprocs > 1:  # SSGD's allreduce staged its GPU gradients
        assert all(s and s["ms_per_mb"] > 0 for s in summary["comm_staging"]), summary
    if recipe == "spoken_digits":
        assert summary["wer"] < 60.0, [m["wer"] for m in metrics]
    else:
        assert summary["top1"] >= 2 * 100.0 / CLASSES, [m["top1"] for m in metrics]


@pytest.mark.parametrize("wire", [None, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", COMPRESSIONS)
def test_choco_messages_of_gpu_buffers_are_the_bytes_a_cpu_sends(name, wire):
    """A GPU learner's compressed message is byte for byte a CPU learner's (the random draws
    are made on the CPU for both), and either end decodes it onto its own device."""
    cfg = ChocoConfig(compression=name, ratio=0.05, levels=15)
    v = torch.randn(1003, generator=torch.Generator().manual_seed(1))
    message, value = compress(v, cfg, draws(0, 1, 7, 0), wire)
    gpu_message, gpu_value = compress(v.to(CUDA), cfg, draws(0, 1, 7, 0), wire)
    assert gpu_message.is_cuda and gpu_value.is_cuda
    assert torch.equal(gpu_message.cpu(), message)
    torch.testing.assert_close(gpu_value.cpu(), value)
    torch.testing.assert_close(decode(message, v.to(CUDA), cfg, wire).cpu(), value)
    torch.testing.assert_close(decode(gpu_message, v, cfg, wire), value)


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ssgd", "dpsgd", "local_sgd", "dasgd"])
def test_elastic_job_on_the_gpu_loses_a_learner_and_a_spare_takes_its_place(algo, tmp_path):
    """Learners and the spare on the GPU under ULFM: learner 2 is killed at step 10, the
    others undo the step in flight from their GPU snapshots, shrink and go on; the spare
    receives a learner's model, optimizer and algorithm state onto the GPU and joins."""
    run_dir = tmp_path / "run"
    proc = run_cli([*ELASTIC_DIGITS, f"algo={algo}", "trainer.device=cuda", "launcher.spares=1",
                    "faults.sigkill.ranks=[2]", "faults.sigkill.step=10",
                    f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=400)
    metrics, summary = read_run(run_dir)
    print(json.dumps({"case": f"elastic-{algo}", "top1": summary["top1"],
                      "samples_per_s": summary.get("samples_per_s"),
                      "membership": summary["membership"], "devices": summary["devices"],
                      "events": [line for line in proc.stderr.splitlines() if " at " in line]}))
    assert summary["status"] == "completed" and summary["learners_at_end"] == 4
    assert [(m["event"], m["learner"], m["learners"]) for m in summary["membership"]] == [
        ("lost", 2, 3), ("joined", 4, 4)]
    assert_every_sample_once(summary)
    assert [count for _, count in learners_alive(run_dir)] == [4, 3, 4]
    assert summary["comm_backend"] == "mpi"
    assert summary["devices"] and all(d.startswith("cuda:0 (") for d in summary["devices"])
    assert summary["top1"] > 60, [m["top1"] for m in metrics]


@pytest.mark.mpi
@pytest.mark.slow
def test_elastic_adpsgd_on_the_gpu_goes_on_without_a_killed_learner(tmp_path):
    """AD-PSGD's learners on the GPU gossip through pinned host memory; learner 2 dies at
    step 10, its partners' exchanges fail, every survivor's gossip is revoked, and the 3 go
    on with new pairs."""
    run_dir = tmp_path / "run"
    proc = run_cli([*ELASTIC_DIGITS, "algo=adpsgd", "trainer.device=cuda",
                    "faults.sigkill.ranks=[2]", "faults.sigkill.step=10",
                    f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=400)
    metrics, summary = read_run(run_dir)
    print(json.dumps({"case": "elastic-adpsgd", "top1": summary["top1"],
                      "membership": summary["membership"],
                      "events": [line for line in proc.stderr.splitlines() if " at " in line]}))
    assert summary["status"] == "completed" and summary["learners_at_end"] == 3
    assert [(m["event"], m["learner"]) for m in summary["membership"]] == [("lost", 2)]
    assert summary["samples"] >= 2 * 1438
    assert all(d.startswith("cuda:0 (") for d in summary["devices"])
    assert summary["top1"] > 60, [m["top1"] for m in metrics]

@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ssgd", "dpsgd", "adpsgd", "choco", "sgp"])
def test_bfloat16_exchange_from_gpu_models_trains_on_fewer_bytes(algo, tmp_path):
    """comm.exchange_dtype=bfloat16 with float32 models on the GPU: what travels is rounded
    on the way out of the GPU (through pinned host memory) and widened on the way in."""
    sent = {}
    for dtype in ("float32", "bfloat16"):
        run_dir = tmp_path / dtype
        run_cli(["recipe=digit_images", f"algo={algo}", "launcher.nprocs=2", "trainer.epochs=3",
                 "trainer.device=cuda", f"comm.exchange_dtype={dtype}",
                 f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=400)
        metrics, summary = read_run(run_dir)
        assert summary["status"] == "completed", summary
        sent[dtype] = summary["bytes_sent"]
        print(json.dumps({"case": f"{algo}-{dtype}", "top1": summary["top1"],
                          "bytes_sent": summary["bytes_sent"]["by_kind"]}))
        assert summary["top1"] > 60, [m["top1"] for m in metrics]
    if algo != "adpsgd":  # AD-PSGD's count of gossips, hence of bytes, varies from run to run
        # The same steps, every value half the size (CHOCO's top-k indices stay int32; SGP's
        # push weight stays float64).
        expected = 0.75 if algo == "choco" else 0.5
        ratio = sent["bfloat16"]["mean_per_step"] / sent["float32"]["mean_per_step"]
        assert abs(ratio - expected) < 0.02, sent


def test_gpu_loader_decodes_crops_and_flips_on_the_gpu_as_on_the_cpu(tmp_path):
    """recipe.loader=gpu: nvJPEG's decode and the crop on the device give the CPU path's pixels
    (the same file, box and flip), and an undecodable file is still named."""
    from test_imagenet_loaders import gpu_path_on, random_crops

    from recipes.imagenet.loaders import resized_crops, resolve_loader

    write_fake_imagenet(tmp_path, classes=2, train_per_class=6, val_per_class=1, size=320,
                        photos=True)
    photos = sorted((tmp_path / "train").rglob("*.JPEG"))
    on_gpu, on_cpu = gpu_path_on("cuda", photos), gpu_path_on("cpu", photos)
    # nvJPEG's IDCT and chroma upsampling are not libjpeg's: a few grey levels on these noisy
    # photos, against > 30 for another crop or the other flip (tests/test_imagenet_loaders.py).
    assert (on_gpu - on_cpu).abs().mean(dim=(1, 2, 3)).max() < 6
    # The batch's resampling on the device (float16 products) is the CPU's (float32) alone.
    images, boxes, flips = random_crops(16, seed=1)
    on_cpu = resized_crops(images, boxes, flips, 64)
    on_gpu = resized_crops([image.to(CUDA) for image in images], boxes, flips, 64, torch.float16)
    assert (on_gpu.cpu() - on_cpu).abs().max() < 0.25
    assert resolve_loader("auto", CUDA, ranks_on_host=1000) == "gpu"  # too few cores each


def test_the_gpu_loader_gives_the_same_pixels_batch_after_batch_while_the_gpu_is_busy(tmp_path):
    """The same batch of files, prepared 60 times a batch ahead on the prefetch thread's stream
    while the training stream is kept busy, gives the pixels it gives alone every time (to
    rounding). Without the wait before nvJPEG decodes (recipes/imagenet/loaders.py,
    decode_on_gpu), the decoder could be handed memory the previous batch's crops still read:
    a ResNet-50 benchmark from JPEG files on an H200 reached a NaN loss."""
    from test_imagenet_loaders import encoded_batch, recipe_for

    write_fake_imagenet(tmp_path, classes=2, train_per_class=16, val_per_class=1, size=500,
                        photos=True)
    batch = encoded_batch(sorted((tmp_path / "train").rglob("*.JPEG")))
    recipe = recipe_for("gpu")
    alone = recipe.to_device(batch, CUDA, torch.float32)[0]
    torch.cuda.synchronize()
    path, busy = ComputePath(device=CUDA), torch.randn(4096, 4096, device=CUDA)
    got = []
    with path.batches(recipe, iter([batch] * 60), prefetch=True) as stream:
        for each in stream:
            images, _ = path.batch(recipe, each)
            busy = (busy @ busy).tanh()  # the training stream's work
            got.append((images - alone).abs().amax(dim=(1, 2, 3)))
    torch.cuda.synchronize()
    # cuBLAS may pick another algorithm on another stream (rounding); a raced buffer is garbage.
    # 0.01 after normalisation is about half a grey level.
    worst = torch.stack(got).amax(dim=1)
    assert (worst < 0.01).all(), worst.tolist()


def test_prefetching_on_a_side_stream_hands_over_the_batches_it_was_given():
    path = ComputePath(device=CUDA)

    class Recipe:
        def to_device(self, batch, device, dtype):
            big = batch.to(device, non_blocking=True).float()
            return (big @ big.T).diagonal()  # kernels on the side stream

    hosts = [torch.full((512, 512), float(k)).pin_memory() for k in range(8)]
    with path.batches(Recipe(), iter(hosts), prefetch=True) as stream:
        got = [path.batch(Recipe(), b) * 1 for b in stream]  # used on the default stream
    torch.cuda.synchronize()
    assert [float(g[0]) for g in got] == [512.0 * k * k for k in range(8)]


@pytest.mark.parametrize("loader", ["gpu", "hybrid"])
def test_imagenet_trains_from_jpegs_with_the_gpu_loader(tmp_path, loader):
    root = tmp_path / "photos"
    write_fake_imagenet(root, classes=CLASSES, train_per_class=12, val_per_class=2, size=160,
                        photos=True)
    run_dir = tmp_path / "run"
    run_cli([*IMAGENET, f"recipe.data.root={root}", f"recipe.loader={loader}", "algo=adpsgd",
             "launcher.nprocs=2", "trainer.device=cuda", "trainer.num_workers=2",
             f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    _, summary = read_run(run_dir)
    assert summary["status"] == "completed" and summary["loader"] == loader
