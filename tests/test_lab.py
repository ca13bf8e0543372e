"""Jobs across hosts: the lab of scripts/lab_cluster.sh (a network + UTS namespace per host,
joined over shaped links) and the local launcher with its hostfile.

Needs root (network namespaces); elsewhere every test here skips with the reason. CI brings
the lab up (`make lab-up`); otherwise the session fixture brings it up itself and takes it down
at the end."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from runner.checkpoint.files import complete_checkpoints

from conftest import BIN, REPO, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.mpi, pytest.mark.resource("lab")]

LAB = REPO / "scripts" / "lab_cluster.sh"
HOSTS = 4

# The lab's ranks run elastic jobs under Open MPI, which polls while a rank waits for a
# message and, oversubscribed, only yields the core between polls: under the kernel's
# autogroup a rank in a session of its own (as the lab's are) hands it to nobody, and these
# jobs wait a lot (steps slowed by faults.delay_s, peers cut off). Here waiting ranks sleep
# 50 us between polls, as docs/lab.md tells users of a shared machine: in make test on a
# fresh clone test_lab.py used 324 CPU s over 475 s with polling, 178 over 300 with sleeps
# (2026-12-05; the false-loss test polls either way). Only this file's jobs: test_elastic's
# keep Open MPI's default, as users run it; no test here measures throughput.
WAITING_RANKS_SLEEP = {"OMPI_MCA_mpi_yield_when_idle": "1",
                       "OMPI_MCA_threads_pthreads_yield_strategy": "nanosleep",
                       "OMPI_MCA_threads_pthreads_nanosleep_time": "50000"}
AS_GIVEN = {name: os.environ.get(name) for name in WAITING_RANKS_SLEEP}  # the user's, or None


@pytest.fixture(scope="module", autouse=True)
def waiting_ranks_sleep() -> Iterator[None]:
    """:data:`WAITING_RANKS_SLEEP` in the environment of every job this file starts (the
    launcher passes Open MPI's settings to the ranks on every host); values already in the
    environment are kept."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in WAITING_RANKS_SLEEP.items():
            patch.setenv(name, AS_GIVEN[name] or value)
        yield


def waiting_ranks_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """Open MPI's idle loop as given to the suite (its default polling, unless set): for a
    test whose ranks' waiting is part of what it measures."""
    for name, value in AS_GIVEN.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)


def lab(*words: str, env: dict | None = None, check: bool = True
        ) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", str(LAB), *words], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)
    if check and proc.returncode != 0:
        pytest.fail(f"lab_cluster.sh {' '.join(words)}: {proc.stdout}{proc.stderr}")
    return proc


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root (network namespaces): run the suite as root")


@pytest.fixture(scope="session")
def lab_overrides() -> list[str]:
    """The lab's launcher overrides, with every host's link up at 1 Gbit/s."""
    needs_root()
    status = lab("status", check=False)
    made_here = status.returncode != 0 or len(re.findall(r"^lab\d+ ", status.stdout,
                                                         re.M)) < HOSTS
    if made_here:
        lab("up", str(HOSTS), "1gbit")
    for host in range(1, HOSTS + 1):
        lab("link", f"lab{host}", "up")
        lab("rate", f"lab{host}", "1gbit")
    overrides = lab("status").stdout.strip().splitlines()[-1].split()
    yield overrides
    if made_here:
        lab("down")


def hostfile(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "hosts"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def veth_bytes(host: str) -> int:
    return sum(int(Path(f"/sys/class/net/{host}-h/statistics/{way}_bytes").read_text())
               for way in ("rx", "tx"))


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "adpsgd-run"), *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_an_evaluation(run_dir: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    metrics = run_dir / "metrics.jsonl"
    wait_until(lambda: metrics.exists() and metrics.read_text().strip(), proc, timeout,
               "no evaluation within the time allowed")


def wait_for_a_checkpoint(run_dir: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until one checkpoint is complete: on a busy machine the first one can still be being
    written well after the first evaluation."""
    wait_until(lambda: complete_checkpoints(run_dir), proc, timeout,
               "no complete checkpoint within the time allowed")


def wait_until(ready: Callable[[], object], proc: subprocess.Popen, timeout: float,
               why: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:  # the launcher's own lines say why (pytest cuts a long repr)
            out, err = proc.communicate()
            pytest.fail(f"the job ended (status {proc.returncode}) while waiting: {why}\n"
                        f"its stderr's end:\n{err[-4000:]}\nits stdout's end:\n{out[-1000:]}")
        assert time.monotonic() < deadline, why
        time.sleep(0.5)


# ---- the lab itself ------------------------------------------------------------------------
def test_the_lab_is_idempotent_repairs_itself_and_goes_away(tmp_path):
    """A separate small lab (own names and subnet): up twice, a lost link repaired by the next
    up, a host's rate changed, a cut link makes the host unreachable, down removes it all."""
    needs_root()
    own = {"LAB_PREFIX": "tlab", "LAB_SUBNET": "10.215.9", "LAB_DIR": str(tmp_path / "lab")}
    # What Open MPI's ranks killed on tlab2 leave, and a segment of another host's.
    stale = Path("/dev/shm/sm_segment.tlab2.0.5f850001.0")
    other = Path("/dev/shm/sm_segment.tlab-head.0.5f850001.0")
    try:
        first = lab("up", "2", "100mbit", env=own)
        assert first.stdout.strip().splitlines()[-1] == (
            f"launcher.hostfile={tmp_path}/lab/hostfile "
            f"launcher.remote_shell={tmp_path}/lab/ssh")
        lab("up", "2", "100mbit", env=own)  # again: nothing to do
        subprocess.run(["ip", "link", "del", "tlab2-h"], check=True)  # a half-made lab
        broken = lab("status", env=own, check=False)
        assert broken.returncode == 1 and re.search(r"tlab2 .* link missing", broken.stdout)
        lab("up", "2", "100mbit", env=own)
        status = lab("status", env=own).stdout
        assert re.search(r"tlab1 +10\.215\.9\.1 +link up +rate 100mbit", status), status
        assert re.search(r"tlab2 +10\.215\.9\.2 +link up +rate 100mbit", status), status
        lab("rate", "tlab1", "1gbit", env=own)
        assert "tlab1" in lab("status", env=own).stdout
        qdisc = subprocess.run(["tc", "qdisc", "show", "dev", "tlab1-h"], capture_output=True,
                               text=True).stdout
        assert "rate 1Gbit" in qdisc, qdisc
        entered = lab("ssh", "-x", "tlab2", "hostname; cat /etc/hosts", env=own).stdout
        assert entered.splitlines()[0] == "tlab2" and "10.215.9.1 tlab1" in entered
        lab("link", "tlab2", "down", env=own)
        cut = lab("ssh", "tlab2", "true", env=own, check=False)
        assert cut.returncode == 255 and "Network is unreachable" in cut.stderr
        bad = lab("rate", "tlab1", "fast", env=own, check=False)
        assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1
        stale.write_bytes(b"\0" * 4096)
        other.write_bytes(b"\0" * 4096)
    finally:
        down = lab("down", env=own)
    try:
        assert "removed 1 shared-memory segment(s)" in down.stdout, down.stdout
        assert not stale.exists() and other.exists()
    finally:
        stale.unlink(missing_ok=True)
        other.unlink(missing_ok=True)
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "tlab" not in namespaces and "tlab" not in links
    assert not Path("/etc/netns/tlab1").exists() and not (tmp_path / "lab").exists()


def test_without_root_the_lab_says_so_in_one_line():
    needs_root()  # to become someone else
    # The scripts copied where nobody can read them: a checkout under a private directory
    # (mktemp -d's mode 0700) would say "Permission denied" before the script could speak.
    readable = Path(tempfile.mkdtemp(prefix="adpsgd-lab-scripts-"))
    try:
        readable.chmod(0o755)
        for script in (LAB, LAB.parent / "shm_segments.sh"):
            shutil.copy(script, readable / script.name)
        proc = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                               "bash", str(readable / LAB.name), "up", "2"],
                              capture_output=True, text=True)
    finally:
        shutil.rmtree(readable)
    assert proc.returncode == 1 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "need root" in proc.stderr, proc.stderr


# ---- jobs across hosts ---------------------------------------------------------------------
FAMILIES = {  # overrides, hostfile lines, ranks per host
    "ssgd": (["algo=ssgd", "launcher.nprocs=2", "launcher.procs_per_node=1"],
             ["lab1", "lab2"], 1),
    "dpsgd": (["algo=dpsgd", "launcher.nprocs=4", "launcher.procs_per_node=2"],
              ["lab1", "lab2"], 2),
    "adpsgd": (["algo=adpsgd", "launcher.nprocs=2", "launcher.procs_per_node=1"],
               ["lab1", "lab2"], 1),
    # The hosts are the super learners: procs_per_node=null and two slots per host.
    "hadpsgd": (["algo=hadpsgd", "launcher.nprocs=4", "launcher.procs_per_node=null"],
                ["lab1:2", "lab2:2"], 2),
    "dasgd": (["algo=dasgd", "launcher.nprocs=2", "launcher.procs_per_node=1"],
              ["lab1", "lab2"], 1),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_algorithm_family_trains_across_two_hosts(lab_overrides, family, tmp_path):
    overrides, lines, per_host = FAMILIES[family]
    shell = next(o for o in lab_overrides if o.startswith("launcher.remote_shell="))
    before = {host: veth_bytes(host) for host in ("lab1", "lab2")}
    run_dir = tmp_path / "run"
    run_cli(["recipe=digit_images", *overrides, "trainer.epochs=2", "trainer.progress=false",
             f"launcher.hostfile={hostfile(tmp_path, lines)}", shell,
             f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=300)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed", summary
    assert [(h["name"], h["ranks"]) for h in summary["hosts"]] == [("lab1", per_host),
                                                                  ("lab2", per_host)]
    assert summary["top1"] > 50, summary["final"]
    if family == "hadpsgd":  # a super learner per host, its ranks one model
        assert summary["procs_per_node"] == 2 and summary["node_replicas_identical"]
    # The training's traffic crossed each host's link (the digits CNN is 0.4 MB; two epochs
    # move tens of MB), not loopback.
    moved = {host: veth_bytes(host) - before[host] for host in before}
    assert all(b > 1_000_000 for b in moved.values()), moved


def test_the_gloo_rendezvous_is_on_the_lab_network(lab_overrides, tmp_path):
    """comm.backend=gloo: torch.distributed meets at rank 0's lab address, not loopback."""
    run_dir = tmp_path / "run"
    run_cli(["recipe=digit_images", "algo=ssgd", "comm.backend=gloo", "launcher.nprocs=2",
             "launcher.procs_per_node=1", "trainer.epochs=1", "trainer.progress=false",
             *lab_overrides, f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=300)
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert re.search(r"rendezvous at tcp://10\.213\.0\.1:\d+", log), log[-2000:]


def test_a_rank_killed_on_another_host_is_named_with_its_host(lab_overrides, tmp_path):
    run_dir = tmp_path / "run"
    proc = start(["recipe=digit_images", "algo=adpsgd", "launcher.nprocs=2",
                  "launcher.procs_per_node=1", "trainer.epochs=400", "trainer.progress=false",
                  "launcher.stall_timeout_s=10", *lab_overrides, f"hydra.run.dir={run_dir}"],
                 tmp_path)
    wait_for_an_evaluation(run_dir, proc)
    pid, host = (run_dir / "logs" / "rank1.pid").read_text().split()[:2]
    assert host == "lab2"
    lab("ssh", "lab2", f"kill -9 {pid}")  # as one would on a cluster: on its host
    _, err = proc.communicate(timeout=120)
    lines = [line for line in err.splitlines() if line.startswith("adpsgd-run:")]
    assert proc.returncode == 137, err
    # Its peer either waits for it (then its heartbeat stops) or crashes in MPI at once (then
    # mpiexec's exit codes tell which rank was killed): either way the line names it.
    assert any(re.match(r"adpsgd-run: rank 1 on host lab2 (\(pid \d+ there\) stopped "
                        r"responding|was killed by signal 9 \(SIGKILL)", line)
               for line in lines), err
    assert not any(line.startswith("[mpiexec@") for line in err.splitlines()), err


def test_a_host_whose_link_is_cut_is_named(lab_overrides, tmp_path):
    run_dir = tmp_path / "run"
    proc = start(["recipe=digit_images", "algo=ssgd", "launcher.nprocs=2",
                  "launcher.procs_per_node=1", "trainer.epochs=400", "trainer.progress=false",
                  "launcher.stall_timeout_s=10", *lab_overrides, f"hydra.run.dir={run_dir}"],
                 tmp_path)
    try:
        wait_for_an_evaluation(run_dir, proc)
        lab("link", "lab2", "down")
        _, err = proc.communicate(timeout=120)
    finally:
        lab("link", "lab2", "up")
    assert proc.returncode == 137, err
    # (How to continue depends on whether the first checkpoint completed before the cut.)
    assert re.search(r"adpsgd-run: rank 1 on host lab2 .* stopped responding: no "
                     r"heartbeat for \d+ s .*its network link is down", err), err


# A segmentation fault inside Open MPI 5.0.11's fault-tolerant agreement, after the survivors
# declared the learners behind a cut link failed (docs/failures.md): a waiting spare's (CI,
# 2026-12-02: under MPIX_Comm_shrink, in ompi_errhandler_proc_failed_internal; 2026-12-04:
# from the progress loop's events), and both survivors' in their shrink, which ended the job
# (make test, 2026-12-04). The wheel's libmpi has no symbols for the agreement's own functions:
# in both of 2026-12-04's crashes the faulting instruction was libmpi.so.40+0x129463, in the
# code that follows mca_coll_ftagree_comm_query (nm -D), under mca_coll_ftagree_iera_intra.
OPEN_MPI_AGREEMENT_CRASH = re.compile(r"Segmentation fault[\s\S]*(?:"
                                      r"ompi_errhandler_proc_failed_internal|mca_coll_ftagree"
                                      r"|libmpi\.so\.40\(\+0x129463\))")


def crashed_in_open_mpis_agreement(run_dir: Path, ranks: list[int]) -> bool:
    logs = [run_dir / "logs" / f"rank{rank}.log" for rank in ranks]
    return any(log.exists() and OPEN_MPI_AGREEMENT_CRASH.search(log.read_text(errors="replace"))
               for log in logs)


# The tests of what follows a loss (not of how soon it is found: bench_silent_host's quick mode
# and the false-loss test keep the defaults) wait 2.5 s of silence rather than the default 1 s:
# beside the suite's other workers on 2 cores, learners on hosts whose link stayed up were
# seen silent for 1.1-2.0 s together (the datagrams of every namespace wait for the same
# CPUs) and taken for lost, 3 times in 2 CI runs.
AFTER_A_LOSS = ["launcher.loss_after_s=2.5"]  # at most link_timeout_s / 2


@pytest.mark.parametrize("algo", ["dpsgd", "adpsgd"])  # a step in lockstep, gossip in flight
def test_an_elastic_job_goes_on_without_the_learners_behind_a_cut_link(lab_overrides,
                                                                       tmp_path, algo):
    """Learners 0-1 on lab1, 2-3 on lab2, two spares on lab3; lab2's link is cut after the
    first evaluation. The launcher stops hearing 2 and 3 and, once they are silent past
    what their heartbeats let it expect (here at least 2.5 s: AFTER_A_LOSS), tells the others,
    whose MPI takes them for failed: the job goes on and takes the spares in, while lab2's
    side, which hears no launcher for launcher.link_timeout_s, stops. The job ends on 4
    learners, and the launcher does not wait for lab2 at the end."""
    run_dir = tmp_path / "run"
    proc = start(["recipe=digit_images", f"algo={algo}", "launcher.nprocs=4",
                  "launcher.procs_per_node=2", "launcher.elastic=true", "launcher.spares=2",
                  "launcher.link_timeout_s=5", *AFTER_A_LOSS, "trainer.epochs=3",
                  "trainer.progress=false", "faults.delay_s=0.05", *lab_overrides,
                  f"hydra.run.dir={run_dir}"], tmp_path)
    try:
        wait_for_an_evaluation(run_dir, proc)
        cut = time.time()
        lab("link", "lab2", "down")
        _, err = proc.communicate(timeout=300)
    finally:
        lab("link", "lab2", "up")
    assert proc.returncode == 0, err[-3000:]
    assert re.search(r"adpsgd-run: learner 2 \(lab2\), learner 3 \(lab2\) lost at [\d,]+ "
                     r"samples: 2 learner\(s\) go on", err), err
    if ("adpsgd-run: spare(s) 5 (lab3) lost while waiting" in err
            and crashed_in_open_mpis_agreement(run_dir, [5])):
        pytest.xfail("spare 5 crashed inside Open MPI's agreement (OPEN_MPI_AGREEMENT_CRASH); "
                     "the job went on with the other spare: " + err[-600:])
    assert re.search(r"adpsgd-run: learner 4 \(lab3\), learner 5 \(lab3\) joined at [\d,]+ "
                     r"samples: 4 learner\(s\) train", err), err
    assert re.search(r"adpsgd-run: learner\(s\) 2, 3 on lab2, which the job went on without, "
                     r"never answered again: mpiexec, which waited for them after the others "
                     r"had ended, was stopped here", err), err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(m["event"], m["learner"], m["host"]) for m in summary["membership"]] == [
        ("lost", 2, "lab2"), ("lost", 3, "lab2"), ("joined", 4, "lab3"), ("joined", 5, "lab3")]
    events = [json.loads(line) for line in (run_dir / "logs" / "events.jsonl").open()]
    silent = [e for e in events if e.get("event") == "silent"]
    assert sorted(e["learner"] for e in silent) == [2, 3], silent
    # The silence counts from the last heartbeat heard, up to a beat (0.2 s) before the cut:
    # the detector waited at least its floor, and the adaptive threshold, not the ceiling
    # (link_timeout_s), decided.
    for e in silent:
        silent_s, threshold_s = map(float, re.search(
            r"no heartbeat for ([\d.]+) s, past the threshold its heartbeats set, ([\d.]+) s",
            e["cause"]).groups())
        assert 1.0 <= threshold_s <= silent_s and threshold_s < 5, e  # (to 2 decimals)
        assert 1.0 - 0.2 <= e["time"] - cut < 5, (e, cut)
    print("cut -> silent, lost:", [round(e["time"] - cut, 2) for e in events])
    assert summary["status"] == "completed" and summary["learners_at_end"] == 4
    assert summary["top1"] > 80, summary["final"]
    if algo == "dpsgd":  # lockstep: every sample of every epoch once (asynchronous learners
        # each cycle through their own shard)
        assert all(e["distinct"] == e["used"] == 1438 for e in summary["epoch_samples"])
    for rank in (2, 3):  # they stopped on their side (the lab's hosts share the run dir)
        assert "this side of a cut link stops" in (
            run_dir / "logs" / f"rank{rank}.log").read_text()


def test_a_loaded_machine_gives_no_false_loss(lab_overrides, tmp_path, monkeypatch):
    """benchmarks/bench_false_loss.py, shorter than as measured (docs/RESULTS.md: 20 runs of
    4 epochs beside 2 busy processes): 10 elastic runs of 2 epochs across two lab hosts (the
    loss detector's defaults: a learner is lost after 1 s of silence, more where its heartbeats
    come irregularly), two runs at a time (4 ranks on the 2 cores, so each loads the other,
    their waiting ranks polling as users' do) beside 1 process that spins on a core: no
    learner is ever taken for lost, every run completes on both learners, and each learner's
    closest call (logs/heartbeats.json) is below its threshold. Every run still starts,
    evaluates and checkpoints under load, where the detector knows the least; in make test
    the other workers load the cores as well. Without the spinning process this test used
    more CPU, not less (111 CPU s over 76 s against 58 over 57, 2026-12-05): its ranks, each
    in a session of its own, polled on the cores the busy process had held. 10 runs, not 20:
    the suite's longest test, where the benchmark's 20 x 4 is the measurement."""
    from test_benchmarks import load_script

    waiting_ranks_poll(monkeypatch)
    out = tmp_path / "false_loss.json"
    assert load_script("bench_false_loss").main(
        ["--count", "10", "--epochs", "2", "--hogs", "1", "--json", str(out), "--runs",
         str(tmp_path / "runs")]) == 0
    result = json.loads(out.read_text())
    assert result["false_losses"] == 0 and result["completed_on_both"] == 10, [
        (run["run"], run["silent"], run["membership"]) for run in result["runs"]]
    for run in result["runs"]:
        assert set(run["closest_calls"]) == {"0", "1"}, run
        assert all(0 < call["share"] < 1 for call in run["closest_calls"].values()), run


def test_learners_taken_for_lost_that_come_back_leave_a_completed_job(lab_overrides, tmp_path):
    """AD-PSGD's learners 2-3 on lab2 are cut off long enough to be taken for lost
    (launcher.link_timeout_s=5), then the link heals before the end: they come back, learn
    they were cut off and leave (EXIT_PEER_LOST, which Open MPI's mpiexec passes on). The job
    the others finished is completed, rc 0, with its membership kept; it was once reported
    failed (status 3), and restarted with launcher.max_restarts."""
    run_dir = tmp_path / "run"
    proc = start(["recipe=digit_images", "algo=adpsgd", "launcher.nprocs=4",
                  "launcher.procs_per_node=2", "launcher.elastic=true",
                  "launcher.link_timeout_s=5", *AFTER_A_LOSS, "launcher.max_restarts=1",
                  "trainer.epochs=4",
                  "trainer.progress=false", "faults.delay_s=0.05", *lab_overrides,
                  f"hydra.run.dir={run_dir}"], tmp_path)
    events = run_dir / "logs" / "events.jsonl"
    try:
        wait_for_an_evaluation(run_dir, proc)
        lab("link", "lab2", "down")
        wait_until(lambda: events.exists() and '"lost"' in events.read_text(), proc, 60,
                   "learners 2-3 were not taken for lost")
    finally:
        lab("link", "lab2", "up")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["learners_at_end"] == 2, summary
    assert [(m["event"], m["learner"]) for m in summary["membership"]] == [("lost", 2),
                                                                          ("lost", 3)]
    assert not summary.get("restarts"), summary["restarts"]
    said = [line for line in err.splitlines() if line.startswith("adpsgd-run:")]
    assert not any("restart" in line or "failed" in line for line in said), said


def test_a_host_whose_processes_are_all_killed_ends_an_elastic_job_naming_it(lab_overrides,
                                                                             tmp_path):
    """Open MPI's runtime ends the whole job when it loses a host's daemon (every process of
    lab2 killed, as when a host goes down), ULFM or not: one line names the host and how to
    continue, instead of Open MPI's notice and a misleading "every learner died"."""
    run_dir = tmp_path / "run"
    proc = start(["recipe=digit_images", "algo=dpsgd", "launcher.nprocs=4",
                  "launcher.procs_per_node=2", "launcher.elastic=true", "trainer.epochs=40",
                  "trainer.progress=false", *lab_overrides, f"hydra.run.dir={run_dir}"],
                 tmp_path)
    wait_for_a_checkpoint(run_dir, proc)  # so that the line can say where to continue from
    # Every process of the host, its MPI daemon among them (the hosts share this machine's
    # process table: their processes are those in the host's network namespace).
    pids = subprocess.run(["ip", "netns", "pids", "lab2"], capture_output=True, text=True,
                          check=True).stdout.split()
    assert pids
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 137, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert re.match(r"adpsgd-run: Open MPI lost its daemon on lab2 \(the host went down, or "
                    r"its processes were killed\).* Fix: check lab2, then continue from "
                    r"\S+ with resume=auto", lines[-2]), err
    assert lines[-1].startswith("adpsgd-run: job failed (exit status 137)"), err
    assert "-" * 20 not in out + err  # Open MPI's notice went to logs/mpiexec.log
    assert "lost communication with a remote daemon" in (run_dir / "logs" /
                                                          "mpiexec.log").read_text() or \
        "failed to report back" in (run_dir / "logs" / "mpiexec.log").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["exit_status"] == 137


# Open MPI 5.0.11's runtime (PRRTE) lost its daemon on lab1, where learners 0-1 run, a few
# seconds after a replacement was spawned onto another host, and ended the job: 2 of 3 CI runs
# of the suite (3 workers, load about 8), never in 7 runs alone or beside 2-4 busy processes.
# The job ends as any lost daemon ends one (a checkpoint, one line, launcher.max_restarts
# resumes it); docs/failures.md says so. Any other failure fails the test.
RUNTIME_LOST_A_DAEMON = re.compile(r"adpsgd-run: Open MPI lost its daemon on lab1 ")


def kill_learner_3_on_lab2(run_dir: Path, proc: subprocess.Popen,
                           after_a_spawn: bool = False) -> str:
    """kill -9 of learner 3 on lab2 after the first evaluation; the job must go on without
    it to the end: returns its stderr. ``after_a_spawn``: a replacement is spawned, and the
    runtime's known loss of a daemon then (RUNTIME_LOST_A_DAEMON) is an expected failure."""
    wait_for_an_evaluation(run_dir, proc)
    pid, host = (run_dir / "logs" / "rank3.pid").read_text().split()[:2]
    assert host == "lab2"
    lab("ssh", "lab2", f"kill -9 {pid}")
    _, err = proc.communicate(timeout=240)
    if proc.returncode and after_a_spawn and RUNTIME_LOST_A_DAEMON.search(err):
        # Its cause is not known yet: what Open MPI's runtime said comes with the reason.
        runtime = run_dir / "logs" / "mpiexec.log"
        said = runtime.read_text(errors="replace")[-1500:] if runtime.exists() else ""
        pytest.xfail("Open MPI's runtime lost its daemon on lab1 after the spawn (see "
                     "RUNTIME_LOST_A_DAEMON): " + err[-600:] + "\nlogs/mpiexec.log: " + said)
    assert proc.returncode == 0, err[-3000:]
    assert re.search(r"adpsgd-run: learner 3 \(lab2\) lost at [\d,]+ samples: 3 learner", err)
    return err


def test_an_elastic_job_goes_on_without_a_learner_killed_on_another_host(lab_overrides,
                                                                         tmp_path):
    """Learners 0-1 on lab1, 2-3 on lab2, the spare on lab3 (Open MPI 5 with ULFM through
    the lab's ssh): learner 3 is killed on lab2; the others go on, the spare joins from
    lab3, and the job ends on 4 learners with every sample used once."""
    run_dir = tmp_path / "run"
    proc = start(["recipe=digit_images", "algo=dpsgd", "launcher.nprocs=4",
                  "launcher.elastic=true", "launcher.spares=1", "trainer.epochs=3",
                  "trainer.progress=false", "faults.delay_s=0.05", *lab_overrides,
                  f"hydra.run.dir={run_dir}"], tmp_path)
    err = kill_learner_3_on_lab2(run_dir, proc)
    assert re.search(r"adpsgd-run: learner 4 \(lab3\) joined at [\d,]+ samples: 4 learner", err)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(m["event"], m["learner"], m["host"]) for m in summary["membership"]] == [
        ("lost", 3, "lab2"), ("joined", 4, "lab3")]
    assert summary["learners_at_end"] == 4
    assert all(e["distinct"] == e["used"] == 1438 for e in summary["epoch_samples"])


def respawning_job(tmp_path: Path, lab_overrides: list[str], epochs: int
                   ) -> tuple[Path, subprocess.Popen]:
    """D-PSGD on 4 learners, 0-1 on lab1 and 2-3 on lab2, with launcher.respawn and a
    hostfile of lab1-lab3 (2 slots each: lab3's are free), its steps slowed."""
    run_dir = tmp_path / "run"
    shell = next(o for o in lab_overrides if o.startswith("launcher.remote_shell="))
    hosts = hostfile(tmp_path, ["lab1 slots=2", "lab2 slots=2", "lab3 slots=2"])
    proc = start(["recipe=digit_images", "algo=dpsgd", "seed=1", "launcher.nprocs=4",
                  "launcher.procs_per_node=2", "launcher.elastic=true", "launcher.respawn=true",
                  "launcher.link_timeout_s=5", *AFTER_A_LOSS, f"trainer.epochs={epochs}",
                  "trainer.progress=false", "faults.delay_s=0.2", f"launcher.hostfile={hosts}",
                  shell, f"hydra.run.dir={run_dir}"], tmp_path)
    return run_dir, proc


def test_a_replacement_for_a_killed_learner_starts_on_a_host_that_lost_none(lab_overrides,
                                                                             tmp_path):
    """Learner 3 killed on lab2, where learner 2 still runs: the survivors spawn learner 4
    across the link on lab3's free slots, not beside the ended process on lab2 (where Open
    MPI's runtime once failed the spawn and ended the job), and the job ends on 4
    learners, every sample of every epoch used once."""
    run_dir, proc = respawning_job(tmp_path, lab_overrides, epochs=8)
    err = kill_learner_3_on_lab2(run_dir, proc, after_a_spawn=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(m["event"], m["learner"], m["host"]) for m in summary["membership"]] == [
        ("lost", 3, "lab2"), ("joined", 4, "lab3")], err[-3000:]
    assert summary["learners_at_end"] == 4 and summary["status"] == "completed"
    assert all(e["distinct"] == e["used"] == 1438 for e in summary["epoch_samples"])


def test_replacements_wait_for_a_host_that_answers_again(lab_overrides, tmp_path):
    """lab3 (free slots, no learner) falls silent, then lab2's link is cut: learners 2-3
    are lost, and their replacements have nowhere to go (lab1 is full, lab2 lost processes
    of the job, beside which Open MPI's runtime cannot start one, and lab3 does not
    answer): one line says so, and the 2 learners go on. lab3's link comes back:
    the launcher finds it answering, the learners spawn learners 4-5 there at their next
    step, and the job ends on 4 learners, every sample of every epoch used once."""
    # 16 epochs: lab3 silent for a round, the cut, the wait, lab3 back for a round, the spawn.
    run_dir, proc = respawning_job(tmp_path, lab_overrides, epochs=16)
    events = run_dir / "logs" / "events.jsonl"
    try:
        wait_for_an_evaluation(run_dir, proc)
        lab("link", "lab3", "down")
        time.sleep(6)  # a round of the launcher's questions finds lab3 silent (2 s + 3 s)
        lab("link", "lab2", "down")
        wait_until(lambda: events.exists() and '"respawn waits"' in events.read_text(), proc,
                   60, "the replacements did not wait")
        lab("link", "lab3", "up")
        _, err = proc.communicate(timeout=300)
    finally:
        lab("link", "lab3", "up")
        lab("link", "lab2", "up")
    if proc.returncode != 0 and "every learner of the elastic job died" in err and \
            crashed_in_open_mpis_agreement(run_dir, [0, 1]):
        pytest.xfail("learners 0-1 crashed inside Open MPI's agreement in their shrink "
                     "(OPEN_MPI_AGREEMENT_CRASH), and the job ended saying how to continue: "
                     + err[-600:])
    assert proc.returncode == 0, err[-3000:]
    assert ("adpsgd-run: 2 replacement learner(s) wait for a host: lab2 has lost a process of "
            "the job, and Open MPI's runtime cannot reliably start one there again; lab3 does "
            "not answer; no other host of launcher.hostfile has a free slot; 2 learner(s) go "
            "on meanwhile") in err, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(m["event"], m["learner"], m["host"]) for m in summary["membership"]] == [
        ("lost", 2, "lab2"), ("lost", 3, "lab2"), ("joined", 4, "lab3"), ("joined", 5, "lab3")]
    recorded = [json.loads(line) for line in events.open()]
    back = [e for e in recorded if e["event"] == "host answers"]
    assert [e["host"] for e in back] == ["lab3"], recorded
    waits = next(e for e in recorded if e["event"] == "respawn waits")
    joined = [e for e in recorded if e["event"] == "joined"]
    assert waits["time"] < back[0]["time"] < joined[0]["time"], recorded
    assert summary["status"] == "completed" and summary["learners_at_end"] == 4
    assert all(e["distinct"] == e["used"] == 1438 for e in summary["epoch_samples"])


def test_asynchronous_learners_go_on_without_one_killed_on_another_host(lab_overrides,
                                                                        tmp_path):
    """AD-PSGD's learners 0-1 on lab1, 2-3 on lab2: learner 3 (passive, averaging with
    learners 0 and 2 across the link) is killed on lab2; its partners' exchanges fail, the
    revoke reaches lab1, and the 3 go on with new pairs. The hostfile gives slots in MPICH's
    form and in Open MPI's (docs/lab.md accepts both; Open MPI, which runs elastic jobs, once
    took ``lab1:2`` for a host named so and lost its daemon there)."""
    run_dir = tmp_path / "run"
    hosts = hostfile(tmp_path, ["lab1:2", "lab2 slots=2"])
    placed = [o for o in lab_overrides if not o.startswith("launcher.hostfile=")]
    proc = start(["recipe=digit_images", "algo=adpsgd", "launcher.nprocs=4",
                  "launcher.elastic=true", "trainer.epochs=3", "trainer.progress=false",
                  "faults.delay_s=0.05", *placed, f"launcher.hostfile={hosts}",
                  "launcher.procs_per_node=null", f"hydra.run.dir={run_dir}"], tmp_path)
    kill_learner_3_on_lab2(run_dir, proc)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(m["event"], m["learner"], m["host"]) for m in summary["membership"]] == [
        ("lost", 3, "lab2")]
    assert summary["learners_at_end"] == 3 and summary["samples"] >= 3 * 1438


@pytest.mark.parametrize("elastic, stop, status, ended", [
    (False, signal.SIGINT, 130, "stopped by Ctrl-C after checkpointing"),
    # Open MPI's mpiexec (every elastic job) kills the ranks on SIGINT and SIGTERM; the
    # launcher sends what it forwards instead (SIGUSR2, SIGUSR1), so these stop as others do.
    (True, signal.SIGINT, 130, "stopped by Ctrl-C after checkpointing"),
    (True, signal.SIGTERM, 75, "stopped by a signal after checkpointing (exit status 75)"),
], ids=["mpich-ctrl-c", "elastic-ctrl-c", "elastic-sigterm"])
def test_a_stop_across_hosts_checkpoints_and_the_run_resumes(lab_overrides, tmp_path, elastic,
                                                             stop, status, ended):
    run_dir = tmp_path / "run"
    # 30 epochs: still training when the stop comes after the first evaluation, even on a
    # quick machine; the resume then asks for 4, a few more than the stop's checkpoint has.
    # The elastic job's 3 epochs, its steps slowed (a sleep) for the same reason: unslowed
    # they took 1.4 s, and under make test-loaded the job ended 0.9 s after its first
    # evaluation, before the stop that rank 0 had seen after step 26 of 36 was agreed.
    job = (["algo=ssgd", "launcher.nprocs=2", "trainer.epochs=30"] if not elastic else
           ["algo=dpsgd", "launcher.nprocs=4", "launcher.elastic=true", "trainer.epochs=3",
            "faults.delay_s=0.1"])
    common = ["recipe=digit_images", *job, "launcher.procs_per_node=1",
              "trainer.progress=false", *lab_overrides, f"hydra.run.dir={run_dir}"]
    proc = start(common, tmp_path)
    wait_for_an_evaluation(run_dir, proc)
    proc.send_signal(stop)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err
    assert ended in err, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == ("stopped" if stop == signal.SIGINT else "preempted"), summary
    assert summary["checkpoint"] and complete_checkpoints(run_dir), summary
    resumed = [*common, "resume=auto"] + ([] if elastic else ["trainer.epochs=4"])
    assert complete_checkpoints(run_dir)[-1].samples < 4 * 1438, summary  # 4 epochs to go to
    run_cli(resumed, cwd=tmp_path, timeout=300)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from"], summary


def test_a_host_that_does_not_answer_stops_the_run_before_it_starts(lab_overrides, tmp_path):
    run_dir = tmp_path / "run"
    lab("link", "lab2", "down")
    try:
        proc = run_cli(["recipe=digit_images", "algo=ssgd", "launcher.nprocs=2",
                        "launcher.procs_per_node=1", *lab_overrides, f"hydra.run.dir={run_dir}"],
                       cwd=tmp_path, check=False, timeout=120)
    finally:
        lab("link", "lab2", "up")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith(
        "adpsgd-run: error: launcher.hostfile: host lab2 does not answer"), proc.stderr
    assert "Network is unreachable" in errors[0] and not run_dir.exists()


# ---- the lab's benchmarks, in their --quick modes ------------------------------------------
def test_the_lab_benchmarks_quick_modes(lab_overrides, tmp_path):
    """bench_network (2 hosts, 2 sizes), bench_lab_claims (2 hosts, 1 epoch, ssgd and
    adpsgd), bench_lab_sim over the latter and bench_silent_host (ssgd, a cut link): the JSON
    has its structure and sane numbers, the links carried the bytes, and the lab keeps its
    hosts and rates."""
    from test_benchmarks import positive, run_quick

    before = lab("status").stdout
    network, rows = run_quick(tmp_path, "bench_network")
    [run] = network["runs"]
    assert (run["hosts"], run["rate"], run["allreduce"]) == (2, "1gbit", "ring") and len(rows) == 2
    assert all(positive(f) for f in [*run["allreduce_busbw_fraction"].values(),
                                     *run["exchange_fraction"].values()])
    assert run["veth_bytes"] > 2 * 1024 * 1024  # 1 MB each way at least, over the links
    # The processors' busy time during a stream between two hosts: the lab's stack costs some.
    assert network["cpu"]["mb_moved"] > 20 and network["cpu_s_per_mb"] >= 0
    claims, rows = run_quick(tmp_path, "bench_lab_claims", "--runs", str(tmp_path / "runs"))
    results = claims["networks"]["1gbit"]
    assert set(results) == {"ssgd", "adpsgd"} and len(rows) == 2
    assert all(positive(r["samples_per_s"]) and 0 <= r["comm_share"] <= 1
               for r in results.values())
    assert [h["name"] for h in results["ssgd"]["hosts"]] == ["lab1", "lab2"]
    (tmp_path / "claims.json").write_text(json.dumps(claims))
    compared, rows = run_quick(tmp_path, "bench_lab_sim", "--claims",
                               str(tmp_path / "claims.json"), "--network",
                               str(tmp_path / "bench_network.json"), "--runs",
                               str(tmp_path / "sim"))
    assert compared["cases"] == 2 and len(rows) == 2
    assert all(positive(r["simulated_samples_per_s"])
               for r in compared["networks"]["1gbit"]["rows"].values())
    silent, rows = run_quick(tmp_path, "bench_silent_host", "--runs", str(tmp_path / "silent"))
    [case] = silent["cases"]
    assert (case["algo"], case["fault"], case["learners_at_end"]) == ("ssgd", "cut", 2)
    # decided past the floor less the last beat read before the cut (0.2 s apart, more on a
    # loaded machine: CI saw 0.789 s), training again after that
    assert 0.6 <= case["fault_to_decision_s"] <= case["fault_to_training_s"] < 10, case
    assert case["every_sample_once"] and len(rows) == 1
    assert lab("status").stdout == before
