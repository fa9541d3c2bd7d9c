"""What a new user sees on the command line (issue 56): every option's help and default in
--help, no TensorFlow start-up banner unless --verbose, where a run is (step n/N, epoch n/N)
in its progress lines and summary."""

import argparse
import os
import subprocess
import sys
import time

import pytest
from conftest import ctrtrain_here

from ctrtrain.cli import build_parser, shown_default, subcommands
from ctrtrain.train.controller import position

BANNER = ("oneDNN", "absl::InitializeLog", "cpu_feature_guard")


def options():
    """(command words, its parser, option) of every option of every command."""
    for words, p in subcommands(build_parser()):
        for a in p._actions:
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                yield " ".join(words), p, a


def test_every_option_of_every_command_has_help_and_its_default_once():
    seen = set()
    for command, p, a in options():
        seen.add(command)
        name = f"{command} {'/'.join(a.option_strings) or a.dest}"
        if a.help == argparse.SUPPRESS:
            continue
        assert a.help and a.help.strip(), f"{name}: no help"
        text = p._get_formatter()._expand_help(a)
        assert text.count("(default:") <= 1, f"{name}: {text}"
        assert "(default: None)" not in text and "(default: )" not in text, f"{name}: {text}"
        flag = a.nargs == 0 and not isinstance(a, argparse.BooleanOptionalAction)
        if not flag and shown_default(a.default) is not None:
            assert "default" in text.lower(), f"{name} does not show its default: {text}"
    for words in (["ctrtrain"], ["ctrtrain", "data", "inspect"], ["ctrtrain", "train"],
                  ["ctrtrain", "bench", "quality"], ["ctrtrain", "images", "build"]):
        assert " ".join(words) in seen, words
    for _, p in subcommands(build_parser()):
        p.format_help()     # every help text formats (a % in one would raise)
    parsers = {tuple(w): p for w, p in subcommands(build_parser())}
    featurize = " ".join(parsers["ctrtrain", "data", "featurize"].format_help().split())
    assert "(default: 10)" in featurize and "(default: |)" in featurize
    train = " ".join(parsers["ctrtrain", "train"].format_help().split())
    # A setting whose help says its default is not given a second one.
    assert "(default: the data's; larger leaves room for new ids) --field-size" in train
    assert "(default: 256,128,64)" in train and "(default: auto)" in train


def test_subcommands_walks_the_whole_tree():
    words = [w for w, _ in subcommands(build_parser())]
    assert ["ctrtrain", "bench", "startup"] in words and ["ctrtrain", "images", "list"] in words
    assert all(isinstance(w, list) for w in words)


def test_the_banner_filter_drops_tensorflows_start_up_lines_only(capfd, tmp_path, monkeypatch):
    """...and touches the heartbeat for each: a launcher's watchdog saw them as output."""
    from ctrtrain.heartbeat import ENV
    from ctrtrain.tf_start import banner_filtered
    monkeypatch.setenv(ENV, str(tmp_path / "heartbeat"))
    lines = [b"WARNING: All log messages before absl::InitializeLog() is called are written "
             b"to STDERR\n",
             b"I0000 00:00:1795820509.850666   10380 port.cc:153] oneDNN custom operations "
             b"are on. You may see slightly different numerical results.\n",
             b"I0000 00:00:1795820511.617102   10380 cpu_feature_guard.cc:227] This TensorFlow "
             b"binary is optimized to use available CPU instructions.\n",
             b"To enable the following instructions: AVX2 FMA, in other operations, rebuild "
             b"TensorFlow with the appropriate compiler flags.\n",
             b"E0000 00:00:1795820511.7 10380 cuda_dnn.cc:8] a real error\n",
             b"ctrtrain: warning: kept\n"]
    with banner_filtered():
        for line in lines:
            os.write(2, line)
        print("python's own, kept", file=sys.stderr)
    err = capfd.readouterr().err
    assert not any(b in err for b in BANNER) and "To enable" not in err
    assert "a real error" in err and "ctrtrain: warning: kept" in err and "python's own" in err
    assert (tmp_path / "heartbeat").exists()


def test_a_finished_run_beats_through_its_exit_for_a_bounded_time(tmp_path, monkeypatch):
    """After its summary a run does no step to beat on: its cleanup and exit beat from a
    thread (a 4 s watchdog tore a finished job down on a loaded machine), for limit_s only,
    so that a process hung in its exit is still seen."""
    from ctrtrain import heartbeat
    beat = tmp_path / "heartbeat"
    monkeypatch.setenv(heartbeat.ENV, str(beat))
    heartbeat.finishing(limit_s=2.0)
    until = time.monotonic() + 10
    while not beat.exists() and time.monotonic() < until:
        time.sleep(0.01)
    first = beat.stat().st_mtime_ns
    while beat.stat().st_mtime_ns == first and time.monotonic() < until:
        time.sleep(0.05)
    assert beat.stat().st_mtime_ns > first            # beat again, with no step
    while heartbeat.age(str(beat)) < 1.5 and time.monotonic() < until:
        time.sleep(0.1)
    assert heartbeat.age(str(beat)) >= 1.5            # and then stopped


def test_tensorflows_objects_are_frozen_in_ctrtrains_processes_only():
    """TensorFlow imports with the garbage collector paused: a user's program that imported
    ctrtrain gets the collector back as it had it (on, or off) with nothing frozen; one of
    ctrtrain's own processes (tf_start.own_process) has TensorFlow's objects frozen."""
    import subprocess
    probe = ("import gc, sys; {before}import ctrtrain.tf_start as t; {own}import tensorflow; "
             "print(gc.isenabled(), gc.get_freeze_count())")
    def run(before="", own=""):
        r = subprocess.run([sys.executable, "-c", probe.format(before=before, own=own)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        on, frozen = r.stdout.split()
        return on == "True", int(frozen)
    assert run() == (True, 0)
    on, frozen = run(before="gc.disable(); ", own="t.own_process(); ")
    assert not on and frozen > 100_000


def test_a_process_waiting_on_its_peers_beats_until_it_stops_waiting(tmp_path, monkeypatch):
    """A rank at the job's end waits for the others (shutdown.end_process): it beats while it
    waits, past the bounded beats of its run's end, and not after."""
    from ctrtrain import heartbeat
    beat = tmp_path / "heartbeat"
    monkeypatch.setenv(heartbeat.ENV, str(beat))
    seen = set()
    with heartbeat.waiting():
        until = time.monotonic() + 2.6
        while time.monotonic() < until:
            if beat.exists():
                seen.add(beat.stat().st_mtime_ns)
            time.sleep(0.05)
    assert len(seen) >= 2                              # beat, and beat again
    last = beat.stat().st_mtime_ns
    time.sleep(1.5)
    assert beat.stat().st_mtime_ns == last             # and stopped with the block


def test_a_jobs_processes_get_the_commands_verbosity(monkeypatch):
    from ctrtrain.tf_start import VERBOSE, child_log_env, set_verbose
    for name in (VERBOSE, "TF_CPP_MIN_LOG_LEVEL"):   # set first: restored after the test
        monkeypatch.setenv(name, "0")
        monkeypatch.delenv(name)
    assert child_log_env() == {"TF_CPP_MIN_LOG_LEVEL": "2"}
    set_verbose(False)
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL")
    set_verbose(True)
    assert child_log_env() == {VERBOSE: "1"} and "TF_CPP_MIN_LOG_LEVEL" not in os.environ


def test_a_runs_position_names_its_epoch_or_its_steps():
    assert position(450, 900, 2.0) == "step 450/900 (epoch 1/2)"
    assert position(451, 900, 2.0) == "step 451/900 (epoch 2/2)"
    assert position(900, 900, 2.0) == "step 900/900 (epoch 2/2)"
    assert position(450, 900, 2.0, starting=True) == "step 450/900 (epoch 2/2)"
    assert position(0, 900, 2.0, starting=True) == "step 0/900 (epoch 1/2)"
    assert position(50, 100, 0.5) == "step 50/100 (epoch 0.25/0.5)"
    assert position(7, 40, None) == "step 7/40"           # --steps
    assert position(7, None, None) == "step 7"            # a Pipe stream: length unknown


def ctrtrain_process(*args):
    """`python -m ctrtrain.cli ARGS` as a user's shell runs it: without the suite's
    TF_CPP_MIN_LOG_LEVEL (conftest) or a verbosity inherited from an earlier test."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CPP_MIN_LOG_LEVEL", "CTRTRAIN_VERBOSE")}
    r = subprocess.run([sys.executable, "-m", "ctrtrain.cli", *map(str, args)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny") / "data"
    ctrtrain_here("data", "synth", "--out", d, "--rows", 2_000, "--feature-size", 500,
                  "--files-per-split", 1)
    return d


@pytest.mark.slow
def test_no_tensorflow_banner_unless_verbose_and_where_a_run_is(tiny, tmp_path):
    """The banner comes from TensorFlow's C++ side while it is imported: only a new process
    shows it. `data inspect` does not import TensorFlow at all."""
    r = ctrtrain_process("data", "inspect", tiny / "train")
    assert "records 1,600" in r.stdout and r.stderr == ""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "ctrtrain.cli", "data",
                        "inspect", tiny / "train"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "tensorflow" not in r.stderr
    # An epoch run: 1,600 records, 6 steps of 256 an epoch.
    r = ctrtrain_process("train", "--train", tiny / "train", "--valid", tiny / "valid",
                         "--model-dir", tmp_path / "m", "--epochs", 2, "--batch-size", 256,
                         "--log-every", 2, "--embedding-size", 4, "--deep-layers", "8",
                         "--no-export")
    assert not any(b in r.stderr for b in BANNER), r.stderr
    lines = r.stdout.splitlines()
    assert "[start] step 0/12 (epoch 1/2) " in r.stdout
    assert "[train] step 6/12 (epoch 1/2) loss=" in r.stdout
    assert "[train] step 8/12 (epoch 2/2) loss=" in r.stdout
    assert "[eval] step 6/12 (epoch 1/2) split=valid" in r.stdout
    summary = next(x for x in lines if x.startswith("summary:"))
    assert summary.startswith("summary: step 12/12 (epoch 2/2), ") and \
        " examples/s after warm-up, input-bound " in summary, summary
    assert "None" not in r.stdout
    # A run of steps, one log window: nothing to measure after warm-up, said so.
    r = ctrtrain_process("train", "-v", "--train", tiny / "train", "--model-dir",
                         tmp_path / "s", "--steps", 2, "--embedding-size", 4, "--deep-layers",
                         "8", "--no-export")
    assert "[train] step 2/2 loss=" in r.stdout
    assert "summary: step 2/2, examples/s: too few steps to measure after warm-up, " \
        "input-bound" in r.stdout
    if not any(b in r.stderr for b in BANNER):
        # --verbose hides nothing: TensorFlow says nothing of the kind on this machine.
        bare = subprocess.run([sys.executable, "-c", "import tensorflow"], capture_output=True,
                              text=True, timeout=600,
                              env={k: v for k, v in os.environ.items()
                                   if k != "TF_CPP_MIN_LOG_LEVEL"})
        assert not any(b in bare.stderr for b in BANNER), bare.stderr
