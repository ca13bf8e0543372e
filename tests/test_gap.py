"""adpsgd-gap: the table and JSON hold docs/algorithms.md's values; errors are one line."""

import json
import subprocess
import sys

import pytest

from runner.commands import gap

from conftest import REPO

SIZES = [8, 16, 64, 128]
EXPECTED = {  # n: (spectral_gap, rho), docs/algorithms.md (Topologies and spectral gap)
    "ring": {8: (0.195262, 0.647603), 16: (0.050747, 0.901081), 64: (0.003210, 0.993590),
             128: (0.000803, 0.998395)},
    # time-varying: gap = 1 - SLEM(E[W]) = 1 - rho here, since E[W] = E[W^T W] for n >= 3
    "random_ring": {8: (0.761905, 0.238095), 16: (0.711111, 0.288889),
                    64: (0.677249, 0.322751), 128: (0.671916, 0.328084)},
}


def run_main(capsys, *args):
    status = gap.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("name", EXPECTED)
def test_table(capsys, name):
    status, out, err = run_main(capsys, "--topology", name, "--n", *map(str, SIZES))
    assert status == 0 and err == ""
    header, *rows = out.splitlines()
    assert header.split() == ["topology", "n", "spectral_gap", "rho"]
    assert len(rows) == len(SIZES)
    assert len({len(line) for line in out.splitlines()}) == 1  # aligned columns
    for line, n in zip(rows, SIZES):
        topology, size, spectral_gap, rho = line.split()
        assert (topology, int(size)) == (name, n)
        assert (spectral_gap, rho) == tuple(f"{v:.6f}" for v in EXPECTED[name][n])


@pytest.mark.parametrize("name", EXPECTED)
def test_json(capsys, name):
    status, out, err = run_main(capsys, "--topology", name, "--n", *map(str, SIZES), "--json",
                                "--seed", "4")
    assert status == 0 and err == ""
    records = json.loads(out)
    assert [r["n"] for r in records] == SIZES
    for record in records:
        assert set(record) == {"topology", "n", "spectral_gap", "rho"}
        assert record["topology"] == name
        expected_gap, expected_rho = EXPECTED[name][record["n"]]
        assert record["spectral_gap"] == pytest.approx(expected_gap, abs=1e-6)
        assert record["rho"] == pytest.approx(expected_rho, abs=1e-6)


@pytest.mark.parametrize("args,message", [
    (["--topology", "nope", "--n", "8"], "unknown topology 'nope'"),
    (["--topology", "exponential", "--n", "8", "12"], "exponential cannot use n=12"),
    (["--topology", "bipartite_exponential", "--n", "5"], "n=5"),
    (["--topology", "ring", "--n", "0"], "must be >= 1"),
    (["--topology", "ring", "--n", "x"], "not an integer"),
    (["--topology", "ring"], "--n"),
    (["--topology", "ring", "--n", "8", "--bogus"], "--bogus"),
])
def test_errors_are_one_line_with_status_2(capsys, args, message):
    status, out, err = run_main(capsys, *args)
    assert status == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("adpsgd-gap: error: ")
    assert message in lines[0]


def test_help(capsys):
    status, out, _ = run_main(capsys, "--help")
    assert status == 0 and "--topology" in out and "random_ring" in out


@pytest.mark.slow
def test_module_runs_as_a_command():
    ok = subprocess.run([sys.executable, "-m", "runner.commands.gap", "--topology", "ring",
                         "--n", "8", "--json"], cwd=REPO, capture_output=True, text=True,
                        timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)[0]["rho"] == pytest.approx(0.647603, abs=1e-6)
    bad = subprocess.run([sys.executable, "-m", "runner.commands.gap", "--topology", "exponential",
                          "--n", "6"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("adpsgd-gap: error: topology.name: exponential cannot use n=6")


def test_several_topologies_in_one_table(capsys):
    status, out, _ = run_main(capsys, "--topology", "ring", "random_ring", "--n", "8", "16")
    rows = [line.split()[:2] for line in out.strip().splitlines()[1:]]
    assert status == 0
    assert rows == [["ring", "8"], ["ring", "16"], ["random_ring", "8"], ["random_ring", "16"]]


def test_adpsgd_pairwise_rho_of_the_papers_peer_sets(capsys):
    """--algo adpsgd: one averaging on a random active-passive edge (docs/algorithms.md)."""
    status, out, _ = run_main(capsys, "--topology", "ring", "bipartite_exponential",
                              "complete", "--n", "64", "128", "--algo", "adpsgd", "--json")
    assert status == 0
    rows = {(r["topology"], r["n"]): r for r in json.loads(out)}
    per_event = {("ring", 64): 0.000075, ("ring", 128): 0.000009,
                 ("bipartite_exponential", 64): 0.009439,
                 ("bipartite_exponential", 128): 0.003922,
                 ("complete", 64): 0.015625, ("complete", 128): 0.007812}  # = 1/n
    for key, gap_per_event in per_event.items():
        row = rows[key]
        assert row["spectral_gap"] == pytest.approx(gap_per_event, abs=1e-6)
        assert row["rho"] == pytest.approx(1 - gap_per_event, abs=1e-6)
        assert row["rho_round"] == pytest.approx(row["rho"] ** (key[1] / 2))
    assert 1 - rows[("bipartite_exponential", 64)]["rho_round"] == pytest.approx(0.2618,
                                                                                 abs=1e-4)
    status, out, _ = run_main(capsys, "--topology", "ring", "--n", "8", "--algo", "adpsgd")
    assert out.splitlines()[0].split() == ["topology", "n", "spectral_gap", "rho", "rho_round"]
