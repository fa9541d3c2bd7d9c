"""`ctrtrain bench chaos` (issue 30): a real 2-host allreduce DeepFM job, run undisturbed and
then with three SIGKILLs, one of them a whole simulated host, survives by its retries and
ends where the undisturbed run ended, with nothing left behind."""

import json

import pytest

from conftest import cli, run_cli
from test_distributed import AUC_TOLERANCE, channels
from test_launch import spec_from_example


@pytest.fixture(scope="module")
def data(synth_data):
    return synth_data(rows=20_000, feature_size=2_000, seed=3)[0] / "tf"


@pytest.mark.slow
def test_chaos_allreduce_three_kills_including_a_host(tmp_path, data):
    hp = {"epochs": 3, "batch_size": 256, "checkpoint_every": 5, "log_every": 5}
    spec = spec_from_example(tmp_path, "deepfm-allreduce", channels=channels(data),
                             hyperparameters=hp, max_retry_attempts=5)
    out = tmp_path / "chaos.json"
    r = run_cli("bench", "chaos", spec, "--faults", 3, "--every", 2, "--kinds", "trainer,host",
                "--work-dir", tmp_path / "work", "--json", out, timeout=300)
    report = json.loads(out.read_text())
    faults, calm, chaos = report["faults"], report["undisturbed"], report["chaos"]
    assert len(faults) == 3 and {f["kind"] for f in faults} == {"trainer", "host"}, faults
    assert calm["finished"] and chaos["finished"], r.stdout[-3000:]
    # A kill costs an attempt unless it lands as the job finishes (a process whose part is done):
    # the count depends on timing, the rule does not. The first fault comes at the first
    # checkpoint, long before the end, so at least one attempt is lost.
    lost = chaos["attempts_lost_to_faults"]
    assert chaos["state"] == "completed" and chaos["attempts"] == 1 + lost and lost >= 1, faults
    assert faults[0]["cost_attempt"] and sum(f["cost_attempt"] for f in faults) == lost
    assert chaos["step"] == calm["step"] == 3 * (16_000 // 512)
    assert abs(report["auc_difference"]) < AUC_TOLERANCE
    for run in (calm, chaos):
        assert run["left_behind"] == {"processes": [], "files": []}
    assert 0 < calm["start_up_s"] < calm["seconds"] and calm["checkpoint_interval_s"] > 0
    assert "seconds lost per fault" in r.stdout and "| steps |" in r.stdout


def test_chaos_bench_deletes_only_its_own_runs(tmp_path, data):
    """F31: the bench clears DIR/undisturbed and DIR/chaos before it runs; a user's files there
    stay, and the bench refuses (exit 2) before launching anything, whatever the spec."""
    work = tmp_path / "work"
    for name in ("chaos", "undisturbed"):
        (work / name).mkdir(parents=True)
        (work / name / "notes.txt").write_text("mine\n")
    code, out, err = cli("bench", "chaos", tmp_path / "missing.yaml", "--work-dir", work)
    assert code == 2 and "missing.yaml does not exist" in err, err
    spec = spec_from_example(tmp_path, "deepfm-allreduce", channels=channels(data))
    code, out, err = cli("bench", "chaos", spec, "--work-dir", work)
    assert code == 2 and f"{work / 'undisturbed'} exists and is not a run of this bench" in err
    for name in ("chaos", "undisturbed"):
        assert (work / name / "notes.txt").read_text() == "mine\n"
    assert not (work / "undisturbed.log").exists()   # nothing launched
    # Another job's run there (its marker names that job), and a log of the user's where the
    # bench writes its own: refused, kept.
    for name in ("chaos", "undisturbed"):
        (work / name / "ctrtrain-run.json").write_text('{"job": "other-job", "spec": "x"}\n')
    code, out, err = cli("bench", "chaos", spec, "--work-dir", work)
    assert code == 2 and "holds the run of job 'other-job'" in err, err
    other = tmp_path / "other"
    other.mkdir()
    (other / "chaos.log").write_text("mine\n")
    code, out, err = cli("bench", "chaos", spec, "--work-dir", other)
    assert code == 2 and "chaos.log exists and is not the log of a run of this bench" in err, err
    assert (other / "chaos.log").read_text() == "mine\n" and not (other / "undisturbed").exists()
    for name in ("chaos", "undisturbed"):
        assert (work / name / "notes.txt").read_text() == "mine\n"
