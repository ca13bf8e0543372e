"""What a user sees in TensorBoard: real simulated runs, read back through TensorBoard's own
server and its HTTP data API (the endpoints its dashboards call), not the event files."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from conftest import BIN, ctrl_c_simulation, run_cli

pytestmark = pytest.mark.slow

# TensorBoard's run names (the directory of the events, relative to the log dir) and algos.
COMPLETED = {"sweep/0-algo=ssgd/tb": "ssgd", "sweep/1-algo=adpsgd/tb": "adpsgd",
             "resumed/tb": "dpsgd"}
RUNS = {**COMPLETED, "stopped/tb": "dpsgd"}


def stop_while_training(cwd: Path, run_dir: str, *args: str) -> None:
    """A dpsgd simulation, Ctrl-C'd while it trains."""
    status, output = ctrl_c_simulation(cwd, run_dir, *args)
    assert status == 130, output


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Two simulated runs in a sweep (one process, about 10 s): ssgd and adpsgd on 4
    learners; a dpsgd run stopped by Ctrl-C while it trains; and one stopped, then resumed
    and completed. (The latter's stopped first session is a copy of the former's run dir,
    as it lay after the Ctrl-C: the same files a second stopped simulation would leave, for
    one simulation less; the resume then runs in that dir as it would after its own stop.)"""
    root = tmp_path_factory.mktemp("tb")
    run_cli(["-m", "recipe=digit_images", "algo=ssgd,adpsgd", "launcher=sim",
             "launcher.nprocs=4", "trainer.epochs=1", "trainer.eval_every=5",
             "hydra.sweep.dir=sweep"], cwd=root)
    stop_while_training(root, "stopped", "trainer.epochs=20")
    shutil.copytree(root / "stopped", root / "resumed", symlinks=True)
    run_cli(["recipe=digit_images", "algo=dpsgd", "launcher=sim", "launcher.nprocs=4",
             "trainer.epochs=2", "hydra.run.dir=resumed", "resume=auto"], cwd=root)
    return root


@contextmanager
def tensorboard(logdir: Path, runs: list[str]) -> Iterator[str]:
    """``tensorboard --logdir LOGDIR --port 0`` (a free port): its URL once it lists
    ``runs``; stopped on leaving."""
    proc = subprocess.Popen([str(BIN / "tensorboard"), "--logdir", str(logdir), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, output = None, ""
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
            output += line
            match = re.search(r"(http://\S+?:\d+/)", line)
            url = match.group(1) if match else None
        assert url, output
        while sorted(get(url, "data/runs")) != sorted(runs):  # the first scan takes a moment
            assert time.monotonic() < deadline, get(url, "data/runs")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[str]:
    with tensorboard(root, list(RUNS)) as url:
        yield url


def get(url: str, path: str, **query: str) -> Any:
    with urllib.request.urlopen(url + path + ("?" + urllib.parse.urlencode(query) if query
                                              else ""), timeout=30) as reply:
        return json.loads(reply.read())


def post(url: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def test_custom_scalars_chart_tags_the_runs_write(server: str):
    tags = get(server, "data/plugin/scalars/tags")
    layout = get(server, "data/plugin/custom_scalars/layout")
    charts = {(category["title"], chart["title"]): chart["multiline"]["tag"]
              for category in layout["category"] for chart in category["chart"]}
    assert set(charts) == {
        ("compare runs", "held-out top1"), ("compare runs", "held-out loss"),
        ("compare runs", "train samples/s"), ("compare runs", "consensus distance"),
        ("compare runs", "bytes sent per step"),
        ("by global samples", "held-out top1"), ("by global samples", "held-out loss"),
        ("by global samples", "bytes sent (all ranks)"),
        *(("time split", f"{name} s") for name in ("compute", "comm", "idle", "data", "eval")),
        ("learners", "own work per step (s)"), ("learners", "waiting per step (s)")}
    for key, patterns in charts.items():
        for run in COMPLETED:  # every chart overlays every run (the learners': every rank)
            matched = [t for t in tags[run] if any(re.search(p, t) for p in patterns)]
            assert len(matched) == (4 if key[0] == "learners" else 1), (key, run, matched)
    for run in COMPLETED:  # per rank only the split itself: 5 tags a rank, not 8
        per_rank = [t for t in tags[run] if re.fullmatch(r"time/\w+_s/rank\d+", t)]
        assert len(per_rank) == 5 * 4, per_rank


def test_by_samples_steps_are_global_samples(server: str, root: Path):
    for run in COMPLETED:
        rows = [json.loads(line) for line in
                (root / Path(run).parent / "metrics.jsonl").read_text().splitlines()]
        evals = [r for r in rows if r["split"] == "eval"]
        points = get(server, "data/plugin/scalars/scalars", run=run,
                     tag="by_samples/eval/top1")
        assert [step for _, step, _ in points] == [r["samples"] for r in evals]
        assert [value for _, _, value in points] == pytest.approx([r["top1"] for r in evals])
        by_step = get(server, "data/plugin/scalars/scalars", run=run, tag="eval/top1")
        assert [step for _, step, _ in by_step] == [r["step"] for r in evals]


def test_hparams_of_every_run(server: str, root: Path):
    experiment = post(server, "data/plugin/hparams/experiment", {"experimentName": ""})
    names = {h["name"] for h in experiment["hparamInfos"]}
    # adpsgd's own options appear although ssgd has none (no run's experiment hides them).
    assert {"algo", "algo.pattern", "algo.delay_by_one", "topology", "nprocs",
            "launcher.procs_per_node", "comm.backend", "trainer.batch_size"} <= names
    metrics = {m["name"]["tag"] for m in experiment["metricInfos"]}
    assert {"hparam/top1", "hparam/samples_per_s", "hparam/wall_s",
            "hparam/status_code"} <= metrics
    groups = post(server, "data/plugin/hparams/session_groups", {
        "experimentName": "", "startIndex": 0, "sliceSize": 10, "colParams": [],
        "allowedStatuses": ["STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING",
                            "STATUS_UNKNOWN"]})["sessionGroups"]
    assert sorted(g["name"] for g in groups) == sorted(RUNS)
    for group in groups:
        summary = json.loads((root / Path(group["name"]).parent / "summary.json").read_text())
        assert group["hparams"]["algo"] == RUNS[group["name"]]
        values = {m["name"]["tag"]: m["value"] for m in group["metricValues"]}
        if group["name"] in COMPLETED:
            assert summary["status"] == "completed"
            assert group["sessions"][0]["status"] == "STATUS_SUCCESS"
            assert values["hparam/status_code"] == 0
            assert values["hparam/samples_per_s"] == pytest.approx(summary["samples_per_s"])
            assert values["hparam/top1"] == pytest.approx(summary["top1"])
        else:  # Ctrl-C: adpsgd-run wrote its summary and the session's metrics
            assert summary["status"] == "stopped"
            assert group["sessions"][0]["status"] == "STATUS_UNKNOWN"
            assert values["hparam/status_code"] == 1


def test_composed_config_is_a_text_panel(server: str):
    assert get(server, "data/plugin/text/tags") == {
        run: ["config/text_summary"] for run in RUNS}
    for run, algo in RUNS.items():
        [panel] = get(server, "data/plugin/text/text", run=run, tag="config/text_summary")
        assert "<pre><code" in panel["text"] and f"name: {algo}" in panel["text"]


def report(*paths: Path, out: Path) -> str:
    proc = subprocess.run([str(BIN / "adpsgd-report"), *map(str, paths), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_report_names_runs_shortly_across_days(root: Path, tmp_path: Path):
    """adpsgd-report's tb/ names each run by its label: a sweep's by the settings that
    differ, others by their dir, with the parent's name where two would clash (the same
    run name on two days)."""
    day2 = tmp_path / "day2"
    shutil.copytree(root / "stopped", day2 / "stopped")  # another day's run of that name
    out = tmp_path / "report"
    printed = report(root / "stopped", day2 / "stopped", out=out)
    assert f"tensorboard --logdir {out / 'tb'}" in printed
    with tensorboard(out / "tb", [f"{root.name}/stopped", "day2/stopped"]):
        pass
    # Another report into the same dir replaces the links: no run of the first lingers.
    report(root / "sweep", out=out)
    with tensorboard(out / "tb", ["algo=ssgd", "algo=adpsgd"]) as url:
        assert "eval/top1" in get(url, "data/plugin/scalars/tags")["algo=adpsgd"]


def test_a_resumed_run_keeps_the_history_of_its_tags_against_samples(tmp_path: Path):
    """A run trained on with resume=auto (as the README's runs/long): the events of its first
    session stay, for the tags against global samples too. TensorBoard's purge_step (the
    checkpoint's step + 1) once dropped every by_samples point of the first session, whose
    steps, global samples, are all past it; the step-axis tags kept theirs."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    job = ["recipe=digit_images", "algo=dpsgd", "launcher=sim", "launcher.nprocs=4",
           "trainer.eval_every=5", "hydra.run.dir=run"]
    run_cli([*job, "trainer.epochs=1"], cwd=tmp_path)
    run_cli([*job, "trainer.epochs=2", "resume=auto"], cwd=tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
            .splitlines()]
    evals = [r for r in rows if r["split"] == "eval"]
    assert round(evals[0]["epoch"]) < 1 and round(evals[-1]["epoch"]) == 2, evals
    events = EventAccumulator(str(tmp_path / "run" / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("by_samples/eval/top1")] == [r["samples"]
                                                                      for r in evals]
    assert [e.step for e in events.Scalars("eval/top1")] == [r["step"] for r in evals]
