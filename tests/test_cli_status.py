"""The README's multi-host recipe, as written: its commands parse; the study it names,
made here by three searches with the fake benchmark (journal storage), reads back
through `gemm-tune status`."""

import json
import re
import shlex
from pathlib import Path

import optuna

from _fakes import FakeBenchmark
from tuner.cli import build_parser, build_subparsers, main
from tuner.search import open_storage, search

README = Path(__file__).parent.parent / "README.md"


def _recipe():
    text = README.read_text()
    block = re.search(r"<!-- recipe.*?-->\n(.*?)<!-- /recipe -->", text, re.S).group(1)
    return [shlex.split(ln.strip()) for ln in block.splitlines()
            if ln.strip() and not ln.strip().startswith("#")]


def test_readme_recipe_runs_as_written(tmp_path, compile_cache, capsys):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tune, status, report = _recipe()
    assert tune[0] == status[0] == report[0] == "gemm-tune"
    args = build_parser().parse_args(tune[1:])  # the tune line's flags are the CLI's
    assert args.storage and args.study and args.devices == "0,1,2,3" and args.trials
    assert build_subparsers().parse_args(report[1:]).command == "report"
    # the study the recipe names, on a journal file (the recipe's other storage); three
    # "hosts" with the fake benchmark share its budget (a small one here)
    url = f"journal:///{tmp_path / 'study.log'}"
    for seed in (1, 2, 3):
        b = FakeBenchmark(nvcc=False)
        search(b.shape, b, trials=6, seed=seed, jobs=1, storage=url, study_name=args.study,
               cache_dir=compile_cache, lease=(0.2, 2.0))
    line = [x if x != args.storage else url for x in status[1:]]
    assert main(line + ["--json"]) == 0
    state = json.loads(capsys.readouterr().out)
    assert len(state) == 1 and state[0]["study"] == args.study
    assert state[0]["done"] == 6 and state[0]["running"] == state[0]["stale"] == 0
    assert all(w["state"] == "stopped" for w in state[0]["workers"].values())
    assert main(line) == 0  # the table
    assert "done" in capsys.readouterr().out


def test_status_names_a_missing_study(tmp_path, capsys):
    url = f"journal:///{tmp_path / 'studies.log'}"
    optuna.create_study(study_name="another", storage=open_storage(url))
    assert main(["status", "--storage", url, "--study", "nope"]) == 2
    assert "no study 'nope'" in capsys.readouterr().err
