"""The CLI's progress bars (`polykv.cli.progress`): drawn on a terminal, naming the run and reaching 100%;
nothing drawn when stderr is not a terminal (a pipe, CI, a log) or under `--no-progress`."""

from __future__ import annotations

import io
import json
import re
import sys

import pytest

from polykv.cli import progress as progress_module
from polykv.cli.progress import Progress
from polykv.eval.method_protocols import homogeneous_plans
from tests.helpers import MIXED, REPO, TINY_FIDELITY, CliResult, run_cli

# Tiny fidelity settings: one run of the demo model takes a couple of seconds.
TINY_EVAL = ("--samples", "2", "--tasks", "prose", "--prompt-tokens", "96")
BAR_MARKS = ("%|", "\r")  # what a tqdm bar writes: the percentage before the bar, carriage returns between draws


class FakeTTY(io.StringIO):
    """A text stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def enabled(monkeypatch):
    # as a fresh invocation has it; restored afterwards, whatever a `--no-progress` call left behind
    monkeypatch.setattr(progress_module, "ENABLED", True)


@pytest.fixture
def tty_cli(monkeypatch, capsys, demo_model, enabled):
    """The CLI's entry point in-process with stderr a (fake) terminal: `tty_cli(*args)` -> CliResult."""
    from polykv.cli import main

    def run(*args: str) -> CliResult:
        err, captured = FakeTTY(), sys.stderr
        monkeypatch.setattr(sys, "argv", ["polykv", *args])
        monkeypatch.setattr(sys, "stderr", err)
        try:
            with pytest.raises(SystemExit) as exit_info:
                main()
        finally:
            sys.stderr = captured  # capsys's stream again, for what runs next
        code = exit_info.value.code
        return CliResult(
            code if isinstance(code, int) else (0 if code is None else 1), capsys.readouterr().out, err.getvalue()
        )

    return run


def _last_draws(text: str) -> list[str]:
    """What each bar shows when it is left: the last draw before each newline."""
    return [line.rsplit("\r", 1)[-1] for line in text.split("\n") if line]


@pytest.fixture
def steady_clock(monkeypatch):
    """tqdm's clock advancing one second per reading: a rate is always known, so the ETA is always drawn
    (a bar drawn within one clock tick shows '?' instead), whatever the machine's speed."""
    import itertools

    import tqdm.std

    ticks = itertools.count(1_000_000.0)
    monkeypatch.setattr(tqdm.std, "time", lambda: next(ticks))


def test_on_a_terminal_each_run_draws_a_bar_that_names_it_and_reaches_100_percent(enabled, steady_clock):
    stream = FakeTTY()
    with Progress(stream) as bars:
        for name in ("route-uniform-b16", "tova-b16"):
            bars.run(name)
            for done in range(1, 5):
                bars.sample(done, 4, f"prose/{done}")
    text = stream.getvalue()
    assert "run: " not in text  # on a terminal the bar names the run
    first, second = _last_draws(text)
    assert first.startswith("route-uniform-b16: 100%|") and "4/4" in first and "prose/4" in first
    assert second.startswith("tova-b16: 100%|") and "4/4" in second
    assert re.search(r"\[[\d:]+<[\d:]+,", first)  # [elapsed<remaining]: the ETA is shown (any value)


def test_a_fraction_bar_shows_the_step_and_reaches_100_percent(enabled):
    stream = FakeTTY()
    with Progress(stream) as bars:
        bars.start("profile")
        for step in range(1, 11):
            bars.fraction(step / 10, f"decode tova layer {step}")
    (last,) = _last_draws(stream.getvalue())
    assert last.startswith("profile: 100%|") and "decode tova layer 10" in last


def test_a_run_found_finished_draws_no_bar(enabled):
    stream = FakeTTY()
    with Progress(stream) as bars:
        bars.run("already-done")  # run_suite returns at once: no sample is reported
        bars.run("computed")
        bars.sample(1, 1, "prose/0")
    assert "already-done" not in stream.getvalue() and _last_draws(stream.getvalue())[0].startswith("computed: 100%")


def test_notes_print_above_the_bar_and_keep_it_whole(enabled):
    stream = FakeTTY()
    with Progress(stream) as bars:
        bars.run("a")
        bars.sample(1, 2)
        bars.note("study: placement")
        bars.sample(2, 2)
    assert "study: placement\n" in stream.getvalue() and _last_draws(stream.getvalue())[-1].startswith("a: 100%")


def test_off_a_terminal_nothing_is_drawn_and_each_run_is_one_line(enabled):
    stream = io.StringIO()  # isatty() is False: a pipe, a log file
    with Progress(stream) as bars:
        bars.start("eval")
        bars.sample(1, 2, "prose/0")
        bars.fraction(0.5, "prefill tova layer 0")
    assert stream.getvalue() == ""
    with Progress(stream) as bars:
        bars.run("route-uniform-b16")
        bars.sample(1, 1, "prose/0")
        bars.run("tova-b16")
    assert stream.getvalue() == "run: route-uniform-b16\nrun: tova-b16\n"


def test_progress_disabled_draws_nothing_even_on_a_terminal(monkeypatch):
    monkeypatch.setattr(progress_module, "ENABLED", False)  # what `--no-progress` sets
    stream = FakeTTY()
    with Progress(stream) as bars:
        bars.start("eval")
        bars.sample(1, 1)
    assert stream.getvalue() == ""


@pytest.mark.slow  # a real CLI process evaluating the demo model
def test_eval_in_a_pipe_prints_no_bar(tmp_path, demo_model):
    # A real process with stderr captured (a pipe): results on stdout, nothing drawn on stderr.
    result = run_cli("eval", "--plan", str(MIXED), *TINY_EVAL, "-w", str(tmp_path), cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("run ") and "mixed-demo on fidelity (demo), finished" in result.stdout
    assert not any(mark in result.stderr for mark in BAR_MARKS), result.stderr


@pytest.mark.slow  # evaluates the demo model twice
def test_eval_on_a_terminal_draws_its_bar_and_no_progress_turns_it_off(tmp_path, tty_cli):
    result = tty_cli("eval", "--plan", str(MIXED), *TINY_EVAL, "-w", str(tmp_path / "a"))
    assert result.returncode == 0, result.stderr
    last = _last_draws(result.stderr)[-1]
    assert last.startswith("mixed-demo on fidelity: 100%|") and "2/2" in last and "prose/" in last
    assert "%|" not in result.stdout and "finished" in result.stdout

    quiet = tty_cli("--no-progress", "eval", "--plan", str(MIXED), *TINY_EVAL, "-w", str(tmp_path / "b"))
    assert quiet.returncode == 0, quiet.stderr
    assert not any(mark in quiet.stderr for mark in BAR_MARKS), quiet.stderr
    assert quiet.stdout.splitlines()[1:] == result.stdout.splitlines()[1:]  # the same scores either way


@pytest.mark.slow  # a sweep on the demo model, twice
def test_experiment_sweep_draws_a_bar_per_run_on_a_terminal_and_one_line_per_run_elsewhere(tmp_path, tty_cli, polykv):
    common = ("--plan", str(MIXED), "--budgets", "16", "--baselines", "tova", "--metric", "kl", "-w", str(tmp_path))
    settings = ("--settings", json.dumps(TINY_FIDELITY.to_dict()))
    result = tty_cli("experiment", "sweep", *common, *settings)
    assert result.returncode == 0, result.stderr
    finished = {line.split(":")[0] for line in _last_draws(result.stderr) if ": 100%|" in line}
    alone = {plan.name for plan in homogeneous_plans("both", 16, 5)}  # like with like: each method alone in scope
    assert finished == {"mixed-demo-uniform-b16", "tova-both-16", "full-both"} | alone, result.stderr
    assert "run: " not in result.stderr and "%|" not in result.stdout

    again = polykv("experiment", "sweep", *common, *settings)  # captured stderr: not a terminal
    assert again.returncode == 0, again.stderr
    assert not any(mark in again.stderr for mark in BAR_MARKS), again.stderr
    runs = [line for line in again.stderr.splitlines() if line.startswith("run: ")]
    assert len(runs) == len(finished) and again.stdout == result.stdout
