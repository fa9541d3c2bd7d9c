"""The README, checked against the code so that it cannot drift: its quick start runs as written
(the fenced blocks after `<!-- quickstart-test -->`, extracted from README.md itself, in order,
in one directory) on a CSV made from a real sample; every `ctrtrain` command line and every
`--flag` it shows exists; its links resolve; the two commands the project promises are there."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, shared_data

README = ROOT / "README.md"
MARK = "<!-- quickstart-test -->"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", re.M | re.S)


def blocks(text: str) -> list[tuple[str, str, bool]]:
    """(language, code, marked) of every fenced block; marked: the MARK comment is the last
    thing before it."""
    return [(m.group(1), m.group(2), text[:m.start()].rstrip().endswith(MARK))
            for m in FENCE.finditer(text)]


def commands(code: str) -> list[list[str]]:
    """The command lines of a bash block: continuations joined, comments dropped."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(words)
    return out


def my_csv(path: Path) -> list[str]:
    """What a user's my.csv holds, made from DeepCTR's MovieLens sample (200 rows of
    MovieLens-1M; tests/data/README.md) the way a user would: a `click` column (a rating of 4
    or more), and as `hist_movie_id` the movies rated just before the row, oldest first (the
    sample holds one or two rows per user, so the site's recent history stands in for the
    user's: the same column, the same format). Returns the header."""
    import pandas as pd
    d = pd.read_csv(shared_data() / "deepctr_samples" / "movielens_sample.txt")
    d = d.sort_values("timestamp", kind="stable").reset_index(drop=True)
    movies = d.movie_id.astype(str).tolist()
    d["hist_movie_id"] = ["|".join(movies[max(0, i - 4):i]) for i in range(len(d))]
    d.insert(0, "click", (d.pop("rating") >= 4).astype(int))
    columns = ["click", "user_id", "movie_id", "title", "timestamp", "genres", "gender", "age",
               "occupation", "zip", "hist_movie_id"]
    d[columns].to_csv(path, index=False)
    return columns


def test_the_readme_keeps_the_two_commands_and_stays_short():
    text = README.read_text()
    bash = [c for lang, code, _ in blocks(text) if lang == "bash" for c in commands(code)]
    assert ["bash", "scripts/quickstart.sh"] in bash and ["bash", "scripts/test.sh"] in bash
    assert len(text.splitlines()) <= 200


def _options(parser) -> set[str]:
    """Every option string of the parser and its sub-commands, at any depth."""
    import argparse
    found = {s for a in parser._actions for s in a.option_strings}
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub in a.choices.values():
                found |= _options(sub)
    return found


def test_every_ctrtrain_command_and_flag_the_readme_shows_exists():
    """Each `ctrtrain` line of its bash blocks parses as the CLI parses it; each job spec it
    launches exists; each --flag it names anywhere is an option of some command."""
    from ctrtrain.cli import build_parser
    text = README.read_text()
    lines = [c for lang, code, _ in blocks(text) if lang == "bash" for c in commands(code)]
    spans = [shlex.split(s) for s in
             re.findall(r"`((?:\.venv-hvd/bin/)?ctrtrain launch [^`]*)`", text)]
    lines += [s for s in spans if not any(w.isupper() for w in s)]     # not `launch SPEC`
    checked = 0
    for words in lines:
        if not words[0].endswith("ctrtrain"):
            continue
        try:
            a = build_parser().parse_args(words[1:])
        except SystemExit:
            pytest.fail(f"the README's `{' '.join(words)}` does not parse")
        if words[1] == "launch":
            assert (ROOT / a.spec).is_file(), a.spec
        checked += 1
    assert checked >= 10, checked
    known = _options(build_parser())
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))
    assert named <= known, f"not an option of any command: {sorted(named - known)}"


@pytest.mark.parametrize("doc", ["README.md", "docs/README.md"])
def test_the_links_resolve(doc):
    path = ROOT / doc
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text())
    assert targets
    missing = [t for t in targets if not t.startswith(("http://", "https://"))
               and not (path.parent / t).exists()]
    assert not missing, missing


@pytest.mark.slow
def test_the_readme_quick_start_runs_as_written(tmp_path):
    """The marked blocks, bash under `set -euo pipefail` and Python, with the `ctrtrain` on
    PATH that runs this checkout's code; then what they promise: the declared fields, the
    exported model, the evaluation report, one prediction per test row, the raw signature
    scoring as `ctrtrain predict` does, and TFRecord shards of the fixed schema."""
    text = README.read_text()
    marked = [(lang, code) for lang, code, m in blocks(text) if m]
    assert [lang for lang, _ in marked] == ["bash", "bash", "python"], marked
    work, bin_dir = tmp_path / "work", tmp_path / "bin"
    work.mkdir()
    bin_dir.mkdir()
    columns = my_csv(work / "my.csv")
    # The README's sample line of my.csv names the same columns.
    shown = next(code for lang, code, _ in blocks(text) if lang == "text")
    assert shown.splitlines()[0].split(",") == columns
    shim = bin_dir / "ctrtrain"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m ctrtrain.cli "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"),
                                                     os.environ.get("PYTHONPATH")) if p),
           "CTRTRAIN_NO_PROGRESS": "1"}
    outputs = []
    for lang, code in marked:
        run = (["bash", "-c", "set -euo pipefail\n" + code] if lang == "bash"
               else [sys.executable, "-c", code])
        r = subprocess.run(run, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{lang} block failed:\n{code}\n{r.stdout[-3000:]}\n" \
                                  f"{r.stderr[-3000:]}"
        outputs.append(r.stdout)

    manifest = json.loads((work / "feat" / "train" / "manifest.json").read_text())
    kinds = {f["name"]: f["kind"] for f in manifest["fields"]}
    assert manifest["format"] == "tfrecord"
    assert (kinds["age"], kinds["genres"], kinds["hist_movie_id"], kinds["user_id"]) == (
        "numeric", "multi_hot", "sequence", "categorical")
    assert "title" not in kinds and "timestamp" not in kinds
    versions = list((work / "model" / "export").glob("[0-9]*"))
    assert len(versions) == 1 and (versions[0] / "saved_model.pb").is_file()
    report = json.loads((work / "eval.json").read_text())
    assert 0 <= report["auc"] <= 1 and report["gauc"]["group"] == "user_id"
    assert (work / "eval.png").is_file()
    test_rows = len((work / "split" / "test.csv").read_text().splitlines()) - 1
    predicted = (work / "predictions.csv").read_text().splitlines()
    assert predicted[0] == "row,prob,label" and len(predicted) - 1 == test_rows > 5
    probs = np.array([float(line.split(",")[1]) for line in predicted[1:6]])
    served = np.array([float(x) for x in re.findall(r"\d+\.\d*(?:e-?\d+)?",
                                                    outputs[2].splitlines()[-1])])
    np.testing.assert_allclose(served, probs, rtol=0, atol=1e-6)
    train = json.loads((work / "tfr" / "train" / "manifest.json").read_text())
    test = json.loads((work / "tfr" / "test" / "manifest.json").read_text())
    assert train["format"] == test["format"] == "tfrecord" and "fields" not in train
    assert len(train["files"]) == 4 and test["feature_size"] == train["feature_size"]
