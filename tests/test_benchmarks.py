"""Every benchmark under scripts/ in --quick mode, on real ranks where it trains: the JSON has
the promised structure, the machine context, finite and sane numbers, and the markdown file
gets its rows. Never a timed assertion: what the numbers are is docs/RESULTS.md's business."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from conftest import REPO, cpu_seconds


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_quick(tmp_path, name: str, *extra: str) -> tuple[dict, list[str]]:
    """Run benchmarks/NAME.py --quick; return its JSON and its markdown lines."""
    out, table = tmp_path / f"{name}.json", tmp_path / f"{name}.md"
    args = ["--quick", "--json", str(out), "--markdown", str(table), *extra]
    assert load_script(name).main(args) == 0
    result = json.loads(out.read_text())
    assert result["quick"] is True and "--quick" in result["command"]
    assert result["command"].startswith(f"python benchmarks/{name}.py")
    assert result["machine"]["cores"] >= 1 and result["machine"]["cpu"]
    assert len(result["load_before"]) == 3 and len(result["load_after"]) == 3
    assert result["date"][:2] == "20" and result["elapsed_s"] >= 0
    lines = table.read_text().splitlines()
    assert lines[0].startswith("| ") and set(lines[1]) <= {"|", "-"}
    return result, lines[2:]


def positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.mpi
def test_ssgd_against_ddp(tmp_path):
    r, rows = run_quick(tmp_path, "bench_ssgd_ddp", "--runs", str(tmp_path / "runs"))
    assert r["nprocs"] == 2 and r["repeats"] == 1 and len(rows) == 1
    assert all(positive(x) for x in r["ssgd_samples_per_s"] + r["ddp_samples_per_s"])
    assert r["ratio"] == pytest.approx(r["ssgd_median"] / r["ddp_median"])
    # Same initial model, batches and schedule: the two trained the same thing.
    assert r["warmup_max_abs_difference"] < 1e-3
    assert rows[0].split("|")[8].strip() == f"{r['ratio']:.2f}"


@pytest.mark.mpi
def test_stragglers(tmp_path):
    r, rows = run_quick(tmp_path, "bench_stragglers", "--algos", "ssgd", "adpsgd",
                        "--runs", str(tmp_path / "runs"))
    assert list(r["algorithms"]) == ["ssgd", "adpsgd"] and len(rows) == 2
    for entry in r["algorithms"].values():
        assert positive(entry["even_median"]) and positive(entry["straggler_median"])
        assert 0 < entry["kept"] < 5
        assert len(entry["even_steps_per_rank"]) == 4
    assert r["algorithms"]["adpsgd"]["goal"] == 0.7
    assert isinstance(r["algorithms"]["adpsgd"]["goal_met"], bool)
    # The straggler really was slower: lockstep SSGD takes the same steps on every rank,
    # asynchronous rank 3 fewer than the fastest.
    steps = r["algorithms"]["adpsgd"]["straggler_steps_per_rank"]
    assert steps[3] < max(steps[:3])


@pytest.mark.mpi
def test_dead_rank(tmp_path):
    """--quick: one 2-rank SSGD job, rank 1 killed after its first checkpoint; the JSON says
    when the job named the rank and ended, and that nothing was left behind."""
    runs = tmp_path / "runs"
    r, rows = run_quick(tmp_path, "bench_dead_rank", "--runs", str(runs))
    assert r["bound_s"] == 60 and r["run_dirs"] == str(runs) and len(rows) == 1
    (case,) = r["cases"]
    assert (case["algo"], case["nprocs"], case["killed_rank"]) == ("ssgd", 2, 1)
    assert case["status"] != 0 and positive(case["pid"])
    assert positive(case["verdict_s"]) and case["verdict_s"] <= case["exit_s"]
    assert case["leftover_pids"] == [] and case["checkpoint"].startswith(str(runs / "ssgd-2"))
    assert case["held"] is (case["exit_s"] < r["bound_s"]) and r["all_held"] is case["held"]
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1:4] == ["ssgd", "2", "1"] and cells[5] == f"{case['exit_s']:.2f} s"


@pytest.mark.mpi
def test_dasgd_hiding(tmp_path):
    r, rows = run_quick(tmp_path, "bench_dasgd_hiding", "--runs", str(tmp_path / "runs"))
    assert list(r["taus"]) == ["4"] and len(rows) == 1
    tau = r["taus"]["4"]
    assert positive(r["compute_ms_per_step"]) and positive(tau["hidden_ms_per_step"])
    assert tau["hidden_ratio"] == pytest.approx(tau["hidden_ms_per_step"]
                                                / r["compute_ms_per_step"])
    assert 0 < tau["blocking_ratio"] < 20 and tau["hidden_merge_wait_ms_per_step"] >= 0


@pytest.mark.mpi
@pytest.mark.slow
def test_time_to_wer(tmp_path):
    r, rows = run_quick(tmp_path, "bench_time_to_wer", "--algos", "ssgd", "adpsgd", "hadpsgd",
                        "--runs", str(tmp_path / "runs"))
    assert list(r["algorithms"]) == ["ssgd", "adpsgd", "hadpsgd"]
    assert len(rows) == 5  # three algorithms, then ssgd and adpsgd at the sweep's larger batch
    for entry in r["algorithms"].values():
        assert 0 <= entry["final_wer"] <= 100 and entry["best_wer"] <= entry["final_wer"]
        assert set(entry["time_to_target_s"]) == {"100.0", "50.0"}
        wers = [wer for _, wer in entry["wer_by_epoch"]]
        for target, seconds in entry["time_to_target_s"].items():
            # Reached exactly when some evaluation was at or below the target.
            assert (seconds is not None) == any(w <= float(target) for w in wers)
            assert seconds is None or positive(seconds)
        assert (tmp_path / "runs" / "ssgd" / "metrics.jsonl").exists()
    verdict = r["sweep_verdict"]
    assert set(verdict["tolerated_batch"]) == {"ssgd", "adpsgd"}
    assert isinstance(verdict["claim_holds"], bool)


def test_consensus_contraction_matches_theory_for_the_fixed_ring(tmp_path):
    plot = tmp_path / "consensus.png"
    r, rows = run_quick(tmp_path, "bench_consensus", "--plot", str(plot))
    assert len(rows) == 4 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for row in r["rows"]:
        assert 0 < row["measured_contraction"] < 1 and row["steps"] >= 60
        if row["topology"] == "ring":  # a fixed W contracts at exactly SLEM^2 asymptotically
            assert row["measured_contraction"] == pytest.approx(row["rho"], rel=1e-3)
        else:  # the expectation bound of a random pattern
            assert row["measured_mean_ratio"] < row["rho"] * 1.15


def test_blstm_throughput(tmp_path):
    r, rows = run_quick(tmp_path, "bench_blstm")
    assert (r["num_layers"], r["hidden_size"], r["input_dim"], r["subsample"]) == (2, 64, 120, 2)
    assert positive(r["frames_per_s"]) and math.isfinite(r["final_loss"])
    assert r["audio_seconds_per_s"] == pytest.approx(r["frames_per_s"] / 100)
    assert r["device"] == "cpu" and len(rows) == 1


def test_blstm_full_defaults_are_the_swb2000_shape():
    bench = load_script("bench_blstm")
    args = bench.parse_args([])
    cfg = bench.recipe_config(args)
    m = cfg.recipe.model
    assert (m.num_layers, m.hidden_size, m.bottleneck, args.batch_size) == (6, 512, 256, 32)


def test_staging_cost(tmp_path):
    r, rows = run_quick(tmp_path, "bench_staging")
    (size,) = r["sizes"]
    assert size["megabytes"] == pytest.approx(0.25)
    for key in ("snapshot_ms", "merge_ms", "exchange_ms_per_mb", "collective_ms_per_mb"):
        assert math.isfinite(size[key]) and size[key] >= 0, key
    assert size["exchange_ms"] == pytest.approx(size["snapshot_ms"] + size["merge_ms"])
    assert r["device"] == "cpu" and not size["pinned"] and len(rows) == 1


@pytest.mark.slow
def test_simulator_speed(tmp_path):
    r, rows = run_quick(tmp_path, "bench_sim", "--runs", str(tmp_path / "runs"))
    assert len(rows) == 4  # ssgd and adpsgd at 16 and 64 learners
    assert sorted(r["nprocs"]) == ["16", "64"] and positive(r["reference"]["samples_per_s"])
    for entry in r["nprocs"].values():
        for case in entry["cases"].values():
            assert positive(case["learner_steps_per_host_s"]) and case["samples"] > 0
            assert positive(case["peak_rss_gib_so_far"]) and positive(case["virtual_s"])
    for algo in ("ssgd", "adpsgd"):
        assert positive(r["vs_reference"][algo]["ratio"])


@pytest.mark.mpi
def test_elastic(tmp_path):
    """--quick: ssgd on 4 ranks plain, elastic, and elastic with learner 2 killed a third of
    the way with a spare (the same kill without one, through the same killed_run(), is the
    full mode's); the kill's and the join's cost are measured and every epoch used each
    sample once."""
    r, rows = run_quick(tmp_path, "bench_elastic", "--runs", str(tmp_path / "runs"))
    (case,) = r["cases"]
    assert (case["algo"], case["nprocs"], case["killed_learner"]) == ("ssgd", 4, 2)
    assert positive(case["plain_samples_per_s"]) and positive(case["elastic_samples_per_s"])
    assert positive(case["plain_openmpi_samples_per_s"])
    assert case["killed_top1"] is None and case["kill_to_training_s"] is None  # no such job
    rejoined = case["rejoined"]  # learner 2 killed, and the spare joins
    assert positive(rejoined["kill_to_training_s"]) and positive(rejoined["recovered_s"])
    assert positive(rejoined["samples_per_s_before"])
    assert positive(rejoined["samples_per_s_after"])
    assert case["every_sample_once"] is True
    assert rejoined["learners_at_end"] == 4 and rejoined["top1"] > 50
    assert positive(rejoined["joined_s"])
    assert rejoined["kill_to_joined_s"] > rejoined["joined_s"]
    assert list(case["uninterrupted_top1"]) == ["0"]  # --quick: seed 0's only
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1:3] == ["ssgd", "4"] and cells[-1] == "yes"


@pytest.mark.mpi
def test_held_out(tmp_path):
    """--quick: ssgd on 4 ranks with seed 0, uninterrupted and with learner 2 killed (the
    same kill with a spare is bench_elastic.py's --quick run); the killed run's held-out top-1
    against the uninterrupted run's."""
    r, rows = run_quick(tmp_path, "bench_held_out", "--runs", str(tmp_path / "runs"))
    (case,) = r["cases"]
    assert (case["algo"], case["seeds"], case["kinds"]) == ("ssgd", [0], ["killed"])
    assert case["learners_at_end"] == {"killed-seed0": 3}
    assert all(case["top1"][kind]["0"] > 50 for kind in case["top1"])  # chance is 10 %
    low = high = case["top1"]["uninterrupted"]["0"]
    killed = case["top1"]["killed"]["0"]
    assert case["killed"]["median"] == killed and case["killed"]["standard_error"] is None
    assert case["killed"]["inside"] == (low <= killed <= high) == \
        (case["killed"]["runs_inside"] == 1)
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1:4] == ["ssgd", "1", "0 s"] and cells[6:8] == ["-", "-"]
    assert cells[5] == (f"{killed:.2f} ({killed:.2f}-{killed:.2f}), "
                        f"{case['killed']['runs_inside']} of 1")
    assert cells[8] == ("inside" if case["killed"]["inside"] else "OUTSIDE")


def test_the_simulator_is_compared_with_the_median_of_the_labs_runs():
    """bench_lab_sim.py --claims A B C: each case's lab samples/s is the median of its runs,
    which are kept beside it; the calibration is the median SSGD run of the first network;
    claims of different cases are refused in one line."""
    from runner.errors import UserError

    median_claims = load_script("bench_lab_sim").median_claims

    def claims(ssgd: float, adpsgd: float, tag: str, epochs: int = 8) -> dict:
        case = {"ssgd": {"samples_per_s": ssgd, "run_dir": f"/runs/{tag}/ssgd"},
                "adpsgd": {"samples_per_s": adpsgd, "run_dir": f"/runs/{tag}/adpsgd"}}
        return {"hosts": 4, "epochs": epochs, "networks": {"1gbit": case, "100mbit": case}}

    runs = [claims(900.0, 2300.0, "a"), claims(1000.0, 1700.0, "b"), claims(800.0, 2600.0, "c")]
    median = median_claims(runs, ["a", "b", "c"])
    ssgd, adpsgd = median["networks"]["1gbit"]["ssgd"], median["networks"]["1gbit"]["adpsgd"]
    assert (ssgd["samples_per_s"], ssgd["run_dir"]) == (900.0, "/runs/a/ssgd")
    assert ssgd["lab_runs"] == [800.0, 900.0, 1000.0]
    assert (adpsgd["samples_per_s"], adpsgd["lab_runs"]) == (2300.0, [1700.0, 2300.0, 2600.0])
    one = median_claims(runs[:1], ["a"])["networks"]["100mbit"]["adpsgd"]
    assert one == {**runs[0]["networks"]["100mbit"]["adpsgd"], "lab_runs": [2300.0]}
    with pytest.raises(UserError, match="c.json and a.json ran different cases"):
        median_claims([runs[0], claims(1.0, 1.0, "x", epochs=4)], ["a.json", "c.json"])
    row = {"lab_runs": [1700.0, 2300.0, 2600.0]}
    assert load_script("bench_lab_sim").spread(row) == " (1700-2600)"


def test_held_out_verdict_is_the_median_inside_the_uninterrupted_range():
    compare = load_script("bench_held_out").compare
    inside = compare([96.0, 97.0, 98.0], [95.0, 96.5, 99.0])
    assert inside["inside"] and inside["median"] == 96.5 and inside["runs_inside"] == 1
    assert inside["mean_difference"] == pytest.approx(96.8333 - 97.0, abs=1e-3)
    # sqrt(var(u)/3 + var(o)/3) = sqrt(1/3 + 4.0833/3)
    assert inside["standard_error"] == pytest.approx(1.3017, abs=1e-3)
    outside = compare([96.0, 97.0, 98.0], [90.0, 95.0, 99.0])
    assert not outside["inside"] and outside["runs_inside"] == 0  # 99 is above 98
    assert compare([97.0], [96.0])["standard_error"] is None


@pytest.mark.mpi
def test_respawn(tmp_path):
    """--quick: ssgd on 4 ranks with learner 2 killed a third of the way and a replacement
    spawned, and again with seed 1 (the uninterrupted job to compare with is the full
    mode's). Two epochs may end before a replacement started on a busy machine: then it
    never joined, the job ended on 3, and the row says so."""
    r, rows = run_quick(tmp_path, "bench_respawn", "--runs", str(tmp_path / "runs"),
                        "--seeds", "1")
    (case,) = r["cases"]
    (again,) = case["seeds"]  # the respawned job with seed 1: on 4 again, or never joined
    assert again["seed"] == 1 and again["every_sample_once"] is True and again["top1"] > 50
    assert again["learners_at_end"] in (3, 4) and positive(again["kill_to_training_s"])
    assert (again["learners_at_end"] == 4) == ("kill_to_joined_s" in again)
    assert case["algo"] == "ssgd" and positive(case["kill_to_training_s"])
    assert case["every_sample_once"] is True and case["top1"] > 50
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    if case["learners_at_end"] == 4:
        assert positive(case["joined_s"]) and case["kill_to_joined_s"] > case["joined_s"]
        assert cells[3] == f"{case['kill_to_joined_s']:.2f} s ({case['joined_s']:.2f} s)"
    else:
        assert case["learners_at_end"] == 3 and "kill_to_joined_s" not in case
        assert cells[3] == "never"
    assert cells[1] == "ssgd" and cells[-1] == "yes"
    assert case["uninterrupted_top1"] is None and cells[5] == f"- / {case['top1']:.2f}"


@pytest.mark.mpi
def test_exchange_dtype(tmp_path):
    """--quick: dpsgd on 2 ranks with its models sent in float32, bfloat16 and float16: the
    lower precisions send half the bytes per step and train to a held-out top-1 near the
    float32 one."""
    r, rows = run_quick(tmp_path, "bench_exchange_dtype", "--runs", str(tmp_path / "runs"))
    by_dtype = r["results"]["dpsgd"]
    assert list(by_dtype) == ["float32", "bfloat16", "float16"] and len(rows) == 3
    full = by_dtype["float32"]["bytes_per_step"][0]
    assert positive(full) and full % 4 == 0
    for dtype in ("bfloat16", "float16"):
        assert by_dtype[dtype]["bytes_per_step"] == [full / 2]
        assert abs(by_dtype[dtype]["top1_change"][0]) < 5, by_dtype
    assert by_dtype["float32"]["top1_change"] == [0.0]


@pytest.mark.mpi
def test_node_traffic(tmp_path):
    """--quick: hadpsgd 4 ranks in 2 nodes: a member's share of the node's gradient allreduce
    is the whole gradient (2 (n - 1) / n with n = 2) every step, and the leaders broadcast at
    most one model per step."""
    r, rows = run_quick(tmp_path, "bench_node_traffic", "--runs", str(tmp_path / "runs"))
    shape = r["shapes"]["4x2"]
    model_bytes = 4 * shape["parameters"]
    assert shape["allreduce_bytes_per_step"] == [model_bytes] and len(rows) == 1
    assert 0 < shape["model_broadcasts_per_step"][0] <= 1, shape


@pytest.mark.mpi
def test_startup(tmp_path):
    """--quick: the import floors, adpsgd-run --help and a 2-rank job split into its
    phases, warm and cold."""
    r, rows = run_quick(tmp_path, "bench_startup", "--runs", str(tmp_path / "runs"))
    res = r["results"]
    for name in ("python", "import_torch", "rank_imports", "help"):
        assert positive(res[name]["wall_s"]) and positive(res[name]["cpu_s"]), name
    assert res["import_torch"]["cpu_s"] > res["python"]["cpu_s"]
    for job in (res["job"]["2"], res["job_cold"]["2"]):  # forked ranks, and cold ones
        assert all(positive(job[k]) for k in ("launcher_s", "ranks_start_s", "training_s",
                                              "total_s", "cpu_s")), job
        assert job["launcher_s"] + job["ranks_start_s"] + job["training_s"] < \
            job["total_s"] + 0.5
    assert len(rows) == 4 + 2


@pytest.mark.slow
def test_suite_profile_sums_each_tests_cpu_with_the_processes_it_started(tmp_path, capsys):
    before = cpu_seconds()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert cpu_seconds() - before >= 0.3  # a child's CPU counts once it has been waited for
    report = tmp_path / "suite.xml"
    alone = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}  # not a worker
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "tests/test_data.py", f"--junitxml={report}"], cwd=REPO, check=True,
                   capture_output=True, env=alone)
    cases = list(ET.parse(report).getroot().iter("testcase"))
    assert cases and all({"cpu_s_setup", "cpu_s_call", "cpu_s_teardown"}
                         <= {p.get("name") for p in case.iter("property")} for case in cases)
    profile = load_script("suite_profile")
    rows = profile.read_tests(report)
    assert len(rows) == len(cases) and {r["file"] for r in rows} == {"test_data.py"}
    assert all(r["outcome"] == "passed" and r["cpu_s"] >= 0 for r in rows)
    profile.main([str(report), "--top", "3"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| test_data.py |"))
    assert row.split("|")[2].strip() == str(len(cases))
    assert sum(line.startswith("| test_data.py::") for line in out.splitlines()) == 3
    # When each test ran: the cores' use over time spreads every CPU second once.
    assert all(r["started_at"] > 0 and r["worker"] == "main" for r in rows)
    busy = profile.cores_busy(rows, bin_s=0.05)
    assert busy and min(busy) >= 0
    assert sum(busy) * 0.05 == pytest.approx(sum(r["cpu_s"] for r in rows), rel=1e-6, abs=1e-6)
    assert list(profile.workers_end(rows)) == ["main"] and "Cores in use" in out


def test_suite_processes_names_the_ranks_by_their_launchers_daemon(tmp_path, capsys):
    """Records laid out as the kernel writes them (struct acct_v3): a launcher, mpiexec, its
    proxy and two ranks; a rank's CPU in comp_t with an exponent (8**1 x 150 ticks)."""
    processes = load_script("suite_processes")

    def record(pid, ppid, command, cpu_ticks):
        return processes.RECORD.pack(0, processes.ACCT_VERSION, 0, 0, 0, 0, pid, ppid, 0,
                                     500.0, cpu_ticks, 10, 0, 0, 0, 0, 0, 0, command)

    pacct = tmp_path / "suite.pacct"
    pacct.write_bytes(b"".join([
        record(11, 10, b"adpsgd-run", 150), record(12, 11, b"mpiexec", 1),
        record(13, 12, b"hydra_pmi_proxy", 1),
        record(14, 13, b"python", (1 << 13) | 150), record(15, 13, b"python", 290),
        record(16, 10, b"python", 40)]))  # a script the test ran itself: not a rank
    summary = processes.summarize(processes.read_records(pacct))
    assert summary["ranks"]["count"] == 2
    assert summary["ranks"]["cpu_s"] == pytest.approx(12.1 + 3.0)
    assert summary["ranks"]["start_up_floor_s"] == pytest.approx(3.0)
    assert summary["programs"]["python"] == {"processes": 1, "cpu_s": 0.5}
    assert summary["cpu_s"] == pytest.approx(15.1 + 1.6 + 0.11 + 0.11 + 0.5, abs=0.1)
    processes.main([str(pacct), "--json", str(tmp_path / "out.json")])
    assert "2 ranks used 15.1 CPU s" in capsys.readouterr().out
    assert json.loads((tmp_path / "out.json").read_text()) == summary
    pacct.write_bytes(pacct.read_bytes()[:64] + b"\x00" * 64)  # a version-0 record
    with pytest.raises(SystemExit, match="not a Linux process-accounting file"):
        processes.read_records(pacct)
