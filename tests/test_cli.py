"""adpsgd-run as users drive it: validation, Hydra flags, sweeps, failures and Ctrl-C."""

import os
import subprocess
import sys

import pytest

from runner.commands.compose import SWEEP_NAME_MAX, sweep_subdir
from runner.commands.run import sweep_naming

from conftest import BIN, REPO, read_run, run_cli

BAD_COMMANDS = [
    (["recipe=nope"], "unknown recipe 'nope'", "recipe=spoken_digits"),
    (["algo=nope"], "unknown algo 'nope'", "algo=hadpsgd"),
    (["topology=nope"], "unknown topology 'nope'", "topology=ring"),
    (["launcher=nope"], "unknown launcher 'nope'", "launcher=local"),
    (["trainer.epoch=3"], "unknown key 'trainer.epoch'", "trainer.epochs"),
    (["trainer.epochs=abc"], "trainer.epochs", "trainer.epochs=<int>"),
    (["optim.lr=fast"], "optim.lr", "optim.lr=<float>"),
    (["trainer.batch_size=0"], "trainer.batch_size: must be >= 1", "trainer.batch_size=32"),
    (["optim.lr=0"], "optim.lr: must be > 0", "optim.lr=0.1"),
    (["optim.momentum=1.5"], "optim.momentum", "optim.momentum=0.9"),
    (["launcher.nprocs=0"], "launcher.nprocs: must be >= 1", "launcher.nprocs=2"),
    (["launcher.nprocs=4", "launcher.procs_per_node=0"], "launcher.procs_per_node: must be >= 1",
     "launcher.procs_per_node=2"),
    (["launcher.mpiexec=/no/such/mpiexec"], "mpiexec '/no/such/mpiexec' not found", "mpiexec"),
    (["+nonsense=1"], "nonsense: unknown top-level key", "remove it"),
    (["seed=abc"], "seed: Value 'abc' of type 'str' could not be converted to Integer",
     "seed=<int>"),
    (["recipe=digit_images", "recipe.heldout_fraction=1.5"], "recipe.heldout_fraction",
     "heldout_fraction=0.2"),
    # Decentralized algorithms: participants, nodes, options.
    (["algo=adpsgd", "launcher.nprocs=3"], "needs an even number of them, got 3",
     "launcher.nprocs=4"),
    (["algo=adpsgd", "algo.delay_by_one=true", "launcher.nprocs=5"], "got 5",
     "launcher.nprocs=6"),
    (["algo=hadpsgd", "launcher.nprocs=6", "launcher.procs_per_node=2"],
     "needs an even number of them, got 3", "launcher.nprocs=8 with launcher.procs_per_node=2"),
    (["algo=hadpsgd", "launcher.nprocs=4", "launcher.procs_per_node=null"],
     "needs nodes to form super learners",
     "launcher.procs_per_node=2"),
    (["algo=hadpsgd", "launcher.nprocs=6", "launcher.procs_per_node=4"], "4 does not divide",
     "procs_per_node"),
    # One node larger than the job: one super learner, no gossip (it ran as SSGD, rc 0).
    (["algo=hadpsgd", "launcher.nprocs=4", "launcher.procs_per_node=8"],
     "8 is more than launcher.nprocs=4: the ranks would form one super learner",
     "launcher.procs_per_node=2, or algo=ssgd"),
    (["algo=hadpsgd", "launcher.procs_per_node=1", "algo.delay_by_one=true"],
     "no delay-by-one variant", "algo=adpsgd algo.delay_by_one=true"),
    (["algo=adpsgd", "algo.pattern=spiral"], "algo.pattern: must be fixed or random",
     "algo.pattern=fixed"),
    (["algo=dpsgd", "topology=bipartite_exponential", "launcher.nprocs=3"],
     "bipartite_exponential cannot use n=3", "launcher.nprocs=4"),
    (["algo=dpsgd", "topology=spiral"], "unknown topology 'spiral'", "topology=ring"),
    (["algo=dasgd", "algo.delay=5"], "algo.delay: must be between 0 and algo.tau=4",
     "algo.delay=1"),
    (["algo=local_sgd", "algo.period=0"], "algo.period: must be >= 1", "algo.period=8"),
    (["faults.straggler.ranks=[7]"], "ranks [7] do not exist", "faults.straggler.ranks=[3]"),
    (["faults.delay_s=-1"], "faults.delay_s: must be >= 0", "faults.delay_s=0"),
    (["faults.sigkill.ranks=[1]", "faults.sigkill.step=0"], "faults.sigkill.step: must be >= 1",
     "faults.sigkill.step=10"),
    (["faults.sigkill.how=exti"], "faults.sigkill.how: must be kill or exit, got 'exti'",
     "faults.sigkill.how=kill"),
    # A fault a rank injects into itself, in the simulator, which has no counterpart for it.
    (["launcher=sim", "faults.nonfinite_loss.ranks=[1]", "faults.nonfinite_loss.steps=[3]"],
     "faults.nonfinite_loss.ranks: the simulator does not model it",
     "faults.nonfinite_loss.ranks=[]"),
    (["launcher=sim", "trainer.on_nonfinite=skip_batch"], "trainer.on_nonfinite: the simulator",
     "trainer.on_nonfinite=stop"),
    (["launcher=sim", "faults.sigkill.sample=3"], "faults.sigkill: the simulator",
     "cluster.failures.at_s"),
    (["launcher=sim", "faults.delay_s=0.1"], "faults.delay_s: the simulator",
     "cluster.compute.jitter"),
    (["launcher=sim", "faults.checkpoint_write_delay_s=1"],
     "faults.checkpoint_write_delay_s: the simulator", "cluster.storage_gbps"),
    (["launcher=sim", "faults.eval_delay_s=1"], "faults.eval_delay_s: the simulator",
     "faults.eval_delay_s=0"),
    # Restarts: a count, and only where there is a job to start again.
    (["launcher.max_restarts=-1"], "launcher.max_restarts: must be >= 0",
     "launcher.max_restarts=3"),
    (["launcher.max_restart=2"], "unknown key 'launcher.max_restart'", "launcher.max_restarts"),
]


def assert_one_line_error(status: int, stderr: str, cause: str, fix: str) -> None:
    assert status == 2
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("adpsgd-run: error: ")
    assert cause in lines[0] and "Fix:" in lines[0] and fix in lines[0], lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("args,cause,fix", BAD_COMMANDS[:3] + BAD_COMMANDS[-3:])
def test_bad_overrides_end_with_one_clear_line_before_anything_starts(tmp_path, args, cause,
                                                                      fix):
    proc = run_cli(args, cwd=tmp_path, check=False, timeout=60)
    assert_one_line_error(proc.returncode, proc.stderr, cause, fix)
    assert not (tmp_path / "runs").exists()  # no run dir, no rank


@pytest.mark.parametrize("args,cause,fix", BAD_COMMANDS)
def test_every_bad_override_is_caught_by_the_command_line_check(capsys, args, cause, fix):
    """The whole table through the check that main() runs first, in this process (a
    subprocess per row would spend minutes importing torch; the rows above show that the
    installed command behaves the same)."""
    from runner.commands.run import check_command_line

    with pytest.raises(SystemExit) as exit_info:
        check_command_line(args)
    assert_one_line_error(exit_info.value.code, capsys.readouterr().err, cause, fix)


def test_suggestions_come_from_the_recipe_each_command_line_chose(capsys):
    """One process checking command lines one after another (the config a mistake is
    compared with is composed once per set of group choices): each suggestion comes from its
    own command line's recipe, whichever came before."""
    from runner.commands.run import check_command_line

    said = {}
    for recipe, key in [("digit_images", "hiden"), ("imagenet", "lodaer"),
                        ("digit_images", "lodaer"), ("imagenet", "hiden")]:
        with pytest.raises(SystemExit):
            check_command_line([f"recipe={recipe}", f"recipe.{key}=1"])
        said[recipe, key] = capsys.readouterr().err
    assert "did you mean recipe.hidden?" in said["digit_images", "hiden"]
    assert "did you mean recipe.loader?" in said["imagenet", "lodaer"]
    assert "the keys of recipe are name, heldout_fraction" in said["digit_images", "lodaer"]
    assert "the keys of recipe are name, data, model" in said["imagenet", "hiden"]


@pytest.mark.slow
def test_a_bad_value_in_any_sweep_combination_stops_the_sweep_before_it_starts(tmp_path):
    proc = run_cli(["-m", "algo=ssgd", "launcher.nprocs=1", "optim.lr=0.2,-1",
                    f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "optim.lr: must be > 0" in proc.stderr
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow
def test_help_lists_groups_and_usage(tmp_path):
    proc = run_cli(["--help"], cwd=tmp_path)
    section = proc.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    groups = dict(line.split(": ", 1) for line in section.splitlines() if ": " in line)
    assert "ssgd" in groups["algo"].split(", ") and "dpsgd" in groups["algo"].split(", ")
    assert "digit_images" in groups["recipe"] and "local" in groups["launcher"]
    assert "random_ring" in groups["topology"]
    # The ConfigStore's schema/ groups stand behind the YAML files; they are no user choice.
    assert sorted(groups) == ["algo", "cluster", "experiment", "launcher", "recipe",
                              "topology"], groups
    assert "adpsgd-run" in proc.stdout and "--cfg job" in proc.stdout


@pytest.mark.slow
def test_cfg_job_prints_the_composed_config_without_running(tmp_path):
    proc = run_cli(["--cfg", "job", "algo=ssgd", "trainer.epochs=7"], cwd=tmp_path)
    assert "epochs: 7" in proc.stdout and "name: ssgd" in proc.stdout
    assert "name: spoken_digits" in proc.stdout
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_the_default_job_is_spoken_digits_with_hadpsgd_on_4_ranks_in_2_nodes(tmp_path):
    from omegaconf import OmegaConf

    job = OmegaConf.create(run_cli(["--cfg", "job"], cwd=tmp_path).stdout)
    assert (job.recipe.name, job.algo.name) == ("spoken_digits", "hadpsgd")
    assert (job.launcher.nprocs, job.launcher.procs_per_node) == (4, 2)


@pytest.mark.slow
def test_experiment_preset_overrides_several_groups(tmp_path):
    proc = run_cli(["--cfg", "job", "experiment=digit_images_ssgd"], cwd=tmp_path)
    assert "nprocs: 2" in proc.stdout and "epochs: 3" in proc.stdout


@pytest.mark.slow
def test_multirun_sweep_runs_jobs_one_after_another(tmp_path):
    sweep = tmp_path / "sweep"
    run_cli(["-m", "recipe=digit_images", "algo=ssgd", "launcher.nprocs=1", "trainer.epochs=1",
             "trainer.progress=false", "optim.lr=0.2,0.3", f"hydra.sweep.dir={sweep}"],
            cwd=tmp_path)
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())
    # Each job's dir is named by its number and the swept value, not by the fixed overrides.
    assert [run.name for run in runs] == ["0-optim.lr=0.2", "1-optim.lr=0.3"]
    lrs, ends, starts = [], [], []
    for run in runs:
        metrics, summary = read_run(run)
        assert summary["status"] == "completed"
        lrs.append(float((run / ".hydra" / "run.yaml").read_text().split("lr: ")[1].split()[0]))
        starts.append((run / ".hydra" / "run.yaml").stat().st_mtime)  # written at job start
        ends.append((run / "summary.json").stat().st_mtime)
    assert lrs == [0.2, 0.3]
    assert starts[1] >= ends[0]  # the second job started after the first one finished


def test_a_sweep_names_its_jobs_by_the_keys_it_sweeps():
    sweep = ["-m", "recipe=digit_images", "topology=ring,random_ring", "+seed_extra=1",
             "optim.lr=range(0.1,0.3,0.1)", "hydra.sweep.dir=x"]
    assert sweep_naming(sweep) == (
        "hydra.job.config.override_dirname.exclude_keys=['recipe','seed_extra']")
    assert sweep_naming(sweep[1:]) is None  # a single run
    own = "hydra.job.config.override_dirname.exclude_keys=[]"
    assert sweep_naming([*sweep, own]) is None  # the user's choice stands


def test_sweep_job_dir_names_are_safe_short_and_distinct():
    """What conf/config.yaml's hydra.sweep.subdir makes of a job's swept values."""
    assert sweep_subdir(0, "topology=ring", "digit_images-dpsgd") == "0-topology=ring"
    assert sweep_subdir(3, "", "digit_images-dpsgd") == "3-digit_images-dpsgd"  # nothing swept
    # A path value stays one dir level; list brackets and quotes go, spaces become _.
    assert sweep_subdir(1, "recipe.data.root=/data/my set/a,faults.straggler.ranks=[3,5]",
                        "x") == "1-recipe.data.root=_data_my_set_a,faults.straggler.ranks=3,5"
    long = [sweep_subdir(2, f"{'recipe.data.root=/very/long/path' * 10}{i}", "x")
            for i in range(2)]
    assert all(len(name) == SWEEP_NAME_MAX and name.startswith("2-recipe.data.root=_very_")
               for name in long)
    assert long[0] != long[1]


@pytest.mark.slow
def test_one_rank_runs_in_process_without_mpiexec(tmp_path):
    run_dir = tmp_path / "run"
    # An mpiexec that does not exist proves it is not used for one rank.
    proc = run_cli(["recipe=digit_images", "algo=ssgd", "launcher.nprocs=1",
                    "launcher.mpiexec=/no/such/mpiexec", "trainer.epochs=1",
                    "trainer.batch_size=32", "trainer.eval_every=20",
                    f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    # The console as for ranks of their own: no log records (evaluations as Python dicts).
    console = proc.stdout + proc.stderr
    assert "eval at epoch" not in console and "rank 0 of 1" not in console, console
    metrics, summary = read_run(run_dir)
    assert summary["nprocs"] == 1 and summary["status"] == "completed"
    steps_per_epoch = -(-summary["samples"] // 32)
    # Every trainer.eval_every steps, and at the epoch end.
    assert [m["step"] for m in metrics] == [20, 40, steps_per_epoch]
    assert "rank 0 of 1" in (run_dir / "logs" / "rank0.log").read_text()


@pytest.mark.mpi
def test_a_failing_rank_ends_the_job_with_one_line_and_a_non_zero_status(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(["recipe=digit_images", "algo=ssgd", "launcher.nprocs=2", "optim.lr=1e12",
                    "trainer.epochs=2", "trainer.log_every=1", f"hydra.run.dir={run_dir}"],
                   cwd=tmp_path, check=False, timeout=120)
    assert proc.returncode != 0
    assert "non-finite training loss" in proc.stderr
    assert "Fix: lower optim.lr" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("mpi,overrides,said", [
    ("mpich", ["launcher.mpiexec_args=[-nonsense]"], "unrecognized argument nonsense"),
    ("open-mpi", ["launcher.elastic=true", "launcher.mpiexec_args=[--map-by,nonsense]"],
     "The specified mapby directive is not recognized: Directive: nonsense"),
])
def test_an_mpiexec_that_fails_before_any_rank_starts_is_quoted_in_one_line(
        tmp_path, mpi, overrides, said):
    run_dir = tmp_path / "run"
    proc = run_cli(["recipe=digit_images", "algo=ssgd", "launcher.nprocs=2", *overrides,
                    f"hydra.run.dir={run_dir}"], cwd=tmp_path, check=False, timeout=120)
    lines = proc.stderr.splitlines()
    assert proc.returncode != 0 and len(lines) == 2, proc.stderr
    assert lines[0].startswith(f"adpsgd-run: mpiexec exited with status {proc.returncode} "
                               f"before any rank started; it said: {said}"), lines
    assert lines[0].endswith(f"(all of it in {run_dir}/logs/mpiexec.log)"), lines
    assert lines[1].startswith("adpsgd-run: job failed"), lines


@pytest.mark.slow
def test_non_editable_install_ships_the_configs(tmp_path):
    site = tmp_path / "site"
    # --target installs into its own folder and leaves this environment (and its editable
    # install) alone, unlike --prefix.
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(REPO)], check=True,
                   capture_output=True, timeout=300)
    assert (site / "runner" / "conf" / "config.yaml").exists()
    assert (site / "runner" / "conf" / "recipe" / "digit_images.yaml").exists()
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run(
        [sys.executable, "-c", "import runner.conf; print(runner.conf.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert where.stdout.startswith(str(site))  # the installed copy, not the checkout
    run_dir = tmp_path / "run"
    proc = subprocess.run([str(site / "bin" / "adpsgd-run"), "recipe=digit_images",
                           "algo=ssgd", "launcher.nprocs=1", "trainer.epochs=1",
                           f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert read_run(run_dir)[1]["status"] == "completed"


PRESETS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS)
def test_every_experiment_preset_composes_and_validates(preset):
    from runner.commands.compose import compose_all, validate

    cfg = validate(compose_all([f"experiment={preset}"], False, "config")[0])
    assert cfg.launcher.nprocs >= 1 and cfg.recipe.name and cfg.algo.name


def test_seed_paper_presets_carry_the_papers_numbers():
    from runner.commands.compose import compose_all

    hadpsgd, ssgd = (compose_all([f"experiment={name}"], False, "config")[0]
                     for name in ("swb2000_hadpsgd_64gpu", "swb2000_ssgd_64gpu"))
    assert (hadpsgd.algo.name, hadpsgd.launcher.nprocs) == ("hadpsgd", 64)
    # ADPSGD's 3x larger global batch than SSGD (12,288 against 4,096).
    assert hadpsgd.launcher.nprocs * hadpsgd.trainer.batch_size == 12288
    assert ssgd.launcher.nprocs * ssgd.trainer.batch_size == 4096


@pytest.mark.slow
def test_help_into_a_reader_that_leaves_early_is_quiet():
    """`adpsgd-run --help | head -1`: the pipe closes before the help ends."""
    proc = subprocess.Popen([str(BIN / "adpsgd-run"), "--help"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, bufsize=0)
    proc.stdout.read(10)
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and proc.returncode in (0, 141), err.decode()
