"""What the launch forms start from and the jobs they describe: the Runs page's starting settings and its
evaluation jobs (a plan at its budgets, the baselines and random placements; a proposed first run), and the
Profiles page's starting sizes and its profile jobs. The jobs are built, not started (`app.job_controls`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import streamlit as st

from app.common import profiles
from app.session import current_model, is_demo, workspace
from polykv import jobs
from polykv.plan import Plan
from polykv.question_protocol import QuestionProtocol
from polykv.workspace import results_path


def profile_defaults(model_name: str) -> dict[str, int]:
    """The profile form's starting sequences and tokens per sequence: small on the demo model, so that a
    first profile takes seconds on a laptop CPU."""
    demo = is_demo(model_name)
    return {"sequences": 4 if demo else 20, "max_tokens": 512 if demo else 2048}


@st.cache_data(show_spinner="Finding the RULER settings that fit the model ...", max_entries=8)
def _fitting_ruler(model_name: str, device: str) -> dict:
    from polykv.eval.running.defaults import suite_defaults

    _, _, model, tokenizer = current_model()
    return suite_defaults("ruler", model_name, loaded=(model, tokenizer), first_run=device == "cpu")


def default_settings(suite: str, model_name: str) -> str:
    """The Runs page's starting settings (JSON) of `suite` for `model_name`: the suite's defaults on the model
    (`polykv.eval.running.defaults.suite_defaults`, the rule the CLI and the study start from too), small on the
    demo model; RULER's fitted to the loaded model (on a CPU: a first run of a minute or two)."""
    from polykv.eval.running.defaults import suite_defaults

    if suite == "ruler":
        return json.dumps(_with_question(_fitting_ruler(model_name, current_model()[1])))
    return json.dumps(_with_question(suite_defaults(suite, model_name, small=is_demo(model_name))))


def _with_question(settings: dict) -> dict:
    """A question suite's settings with its question protocol written out after its mode (the default,
    `QuestionProtocol.IN_PROMPT`, is left out of stored settings; the box shows it, so the choice is seen)."""
    if "mode" not in settings or "question" in settings:
        return settings
    out = {}
    for key, value in settings.items():
        out[key] = value
        if key == "mode":
            out["question"] = QuestionProtocol.IN_PROMPT.value
    return out


def settings_missing(text: str, suite: str) -> str | None:
    """Why a settings box launches nothing (one line), or None: an empty box, or an empty object, would run the
    suite's full defaults (for RULER, every task at 4,096 tokens: hours here), so each must name its settings."""
    if not text.strip():
        return f"The suite settings are empty: write them as JSON (the {suite} suite's defaults never run unasked)."
    if "".join(text.split()) == "{}":  # no parsing here: malformed or hostile JSON is the launch's to refuse
        return f"The suite settings name nothing: {{}} would run the {suite} suite's full defaults; name what to run."
    return None


def settings_ready(text: str, suite: str, key: str, model_name: str, reset_key: str | None = None) -> bool:
    """Whether a settings box may launch; if not, says why inline with a button that puts the suggested settings
    back (`settings_missing`, `reset_settings`)."""
    missing = settings_missing(text, suite)
    if missing:
        st.error(missing)
        st.button(
            "Reset to the suggested settings", on_click=reset_settings, args=(key, suite, model_name), key=reset_key
        )
    return missing is None


def reset_settings(key: str, suite: str, model_name: str) -> None:
    """Put the suggested settings back into the settings box (a button's callback: before the box is drawn)."""
    st.session_state[key] = default_settings(suite, model_name)


def eval_job(
    model_name: str,
    device: str,
    plan: Plan,
    suite: str,
    settings_text: str,
    budgets_text: str,
    baselines: Sequence[str],
    placements: int,
    seed: int,
    loaded: tuple[Any, Any] | None = None,
):
    """The evaluation job the Runs page's form describes (not started): the plan at each budget, the
    baselines and the random placements. PolyKVError or ValueError with one line when the form is wrong, or
    when `loaded` (the model and tokenizer) cannot run it (`polykv.eval.running.fit`: a length past the context, a
    task whose shortest prompt does not fit, a capacity past the context)."""
    from polykv.eval.experiments import launch_plans
    from polykv.eval.running.fit import check_fits
    from polykv.eval.running.settings import parse_budgets, suite_settings
    from polykv.eval.running.unit import Unit

    budgets = parse_budgets(budgets_text)
    settings = suite_settings(suite, settings_text)
    labelled = launch_plans(plan, budgets, list(baselines), int(placements), int(seed))
    if loaded is not None:
        check_fits(suite, settings, *loaded, [p for _, p in labelled], int(seed))
    units = [(label, Unit.of(model_name, p, suite, settings, int(seed), device)) for label, p in labelled]
    more = f" + {len(units) - 1} more" if len(units) > 1 else ""
    return jobs.eval_job(units, f"{plan.name} on {suite}{more}")


def first_run(model_name: str, device: str, plan: Plan, minutes: float):
    """The Runs page's proposed first run for `plan` (`polykv.eval.launch.first_run`): from this workspace's runs, the
    model's profiles and its measured speed (the decisive run's samples fit `minutes` here)."""
    from polykv.eval.launch import first_run as proposal
    from polykv.eval.results.store import Store

    _, _, model, tokenizer = current_model()
    store = Store(results_path(workspace()), readonly=True)
    length = min(proposal.LENGTH, _fitting_ruler(model_name, device)["length"])
    scoped = [p for p in profiles(model_name)[0] if p.num_layers == plan.num_layers]
    tasks = proposal.competent(model_name, store, length)[0]
    per_sample = proposal.cost_per_sample(model_name, device, model, tokenizer, tasks, length)
    return proposal.propose(
        model_name,
        plan,
        store,
        length,
        profile=scoped[0] if scoped else None,
        seconds_per_sample=per_sample,
        allowance_s=60.0 * minutes,
    )


def first_run_job(model_name: str, device: str, proposed):
    """The evaluation job of a proposed first run (its pilot or its decisive run)."""
    from polykv.eval.running.unit import Unit

    units = [
        (label, Unit.of(model_name, plan, "ruler", proposed.settings, proposed.seed, device))
        for label, plan in proposed.plans
    ]
    step = "pilot" if proposed.pilot else "decisive run"
    return jobs.eval_job(units, f"first run ({step}): {proposed.plans[0][1].name} vs {proposed.baseline}, answer_nll")


def profile_job(
    model_name: str, device: str, sources: Sequence[str], sequences: int, max_tokens: int, b_cal: int, scope: str
):
    """The profile job the Profiles page's form describes (not started); `b_cal` 0 is automatic. ValueError
    with one line when the form is wrong (no source, a bad one)."""
    from polykv.plan import Scope
    from polykv.profile.corpus import CorpusSpec

    spec = CorpusSpec(sources=tuple(sources), num_sequences=int(sequences), max_tokens=int(max_tokens))
    return jobs.profile_job(
        model_name,
        device,
        spec.to_dict(),
        int(b_cal) or None,
        [p.value for p in Scope(scope).phases],
        f"profile {model_name}",
    )
