"""Plan commands: `plan show`, `plan validate`, `plan homogeneous`, and `methods`, `generate`, `import-llama2c`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from polykv.cli.common import (
    ModelOption,
    _checked_plan,
    _load_model,
    _num_layers,
    _parse_params,
    _table,
    default_plan,
    echo_budget_lines,
)
from polykv.plan import Phase, Plan, Scope

# Long enough (~90 tokens on the demo model) that every capacity in the demo plans evicts at prefill.
DEMO_PROMPT = (
    "Once upon a time, there was a little girl named Lily. She had a red ball and a small dog named Max. "
    "Every day Lily and Max went to the park to play. One day the ball rolled into the pond, and Max "
    "jumped in to get it. Lily laughed and"
)


def methods() -> None:
    """List the eviction methods with their phases, parameters and defaults."""
    from polykv.methods import REGISTRY

    width = max(map(len, REGISTRY)) + 1
    for name, cls in REGISTRY.items():
        phases = ", ".join(p.value for p in Phase if p in cls.phases)
        params = ", ".join(f"{k}={v}" for k, v in cls.defaults().items()) or "-"
        summary = (cls.__doc__ or "").strip().splitlines()[0]
        typer.echo(f"{name:<{width}} phases: {phases:<16} params: {params}")
        typer.echo(f"{'':<{width}} {summary}")


def generate(
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="Text to continue.")] = DEMO_PROMPT,
    plan: Annotated[
        Path | None,
        typer.Option("--plan", help="Plan file (JSON). Default: an embedded model's plans/<model>/mixed.json."),
    ] = None,
    model: ModelOption = "demo",
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 96,
    device: str = "cpu",
    sample: Annotated[bool, typer.Option(help="Sample instead of greedy decoding.")] = False,
    temperature: Annotated[float, typer.Option(min=0.0)] = 1.0,
    seed: int = 0,
) -> None:
    """Generate text with a plan and print the retained cache per layer."""
    from polykv.errors import SettingsError
    from polykv.models import config_dimensions, layer_windows, load_tokenizer, num_layers, quiet_transformers

    routed_plan = _checked_plan(plan or default_plan(model), model, device)  # bad input fails before the weights load
    with quiet_transformers():  # its "longer than the maximum" warning: said below in one line
        prompt_tokens = len(load_tokenizer(model)(prompt).input_ids)
    context = config_dimensions(model).context_length
    if context is not None and prompt_tokens + max_new_tokens > context:
        room = f"at most {context - prompt_tokens} new tokens" if prompt_tokens < context else "a shorter prompt"
        raise SettingsError(
            f"the prompt is {prompt_tokens:,} tokens and --max-new-tokens {max_new_tokens}: more than the model's "
            f"{context:,}-token context (ask for {room})"
        )
    import torch  # after the checks above: a refused model or plan loads neither torch nor the runtime

    from polykv.runtime import routed

    hf_model, tokenizer = _load_model(model, device)
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
    torch.manual_seed(seed)
    sampling = {"do_sample": True, "temperature": temperature} if sample else {"do_sample": False}
    with torch.no_grad(), routed(hf_model, routed_plan) as session:
        out = hf_model.generate(ids, max_new_tokens=max_new_tokens, **sampling)
    new = out[0, ids.shape[1] :]
    typer.echo(
        f"model: {model} ({num_layers(hf_model)} layers)   plan: {routed_plan.name} (scope {routed_plan.scope.value})"
    )
    typer.echo(f"prompt: {ids.shape[1]} tokens   generated: {len(new)} tokens\n")
    typer.echo(tokenizer.decode(out[0], skip_special_tokens=True))  # whole text: joins at the right space
    typer.echo("\nretained KV slots per KV head (after prefill -> at the end):")
    windows = layer_windows(hf_model)
    rows = [
        (str(idx), str(lp.prefill), str(lp.decode), str(layer.retained_after_prefill), str(layer.retained))
        for idx, (lp, layer) in enumerate(zip(routed_plan.layers, session.cache.layers))
    ]
    if any(windows):  # a hybrid model: say which layers are local (their cache never outgrows the window)
        rows = [(r[0], "global" if w is None else f"local {w}", *r[1:]) for r, w in zip(rows, windows)]
        _table(("layer", "attention", "prefill", "decode", "after prefill", "end"), rows)
    else:
        _table(("layer", "prefill", "decode", "after prefill", "end"), rows)
    typer.echo(f"true sequence length: {session.cache.get_seq_length()}")


def plan_show(
    path: Path,
    model: Annotated[
        str | None,
        typer.Option(
            "--model", "-m", help="Show the plan on this model: its local and global layers and the KV each keeps."
        ),
    ] = None,
    tokens: Annotated[
        int | None,
        typer.Option(min=1, help="With --model: the prompt length the KV is counted at (default: its context)."),
    ] = None,
) -> None:
    """Summarize a plan: totals, averages and method counts per phase, then every layer (with --model, which layers
    are local or global and the KV memory each keeps against FullKV's)."""
    loaded = Plan.load(path) if model is None else _checked_plan(path, model)  # a wrong model fails first
    if model is not None and tokens is not None:  # before anything is printed
        from polykv.models import config_dimensions

        context = config_dimensions(model).context_length
        if context and tokens > context:
            raise ValueError(f"--tokens {tokens:,} is longer than {model}'s context ({context:,} tokens)")
    for line in loaded.summary().lines():
        typer.echo(line)
    if loaded.description:
        typer.echo(f"  {loaded.description}")
    typer.echo("")
    if model is None:
        _table(
            ("layer", "prefill", "decode"),
            [(str(i), str(lp.prefill), str(lp.decode)) for i, lp in enumerate(loaded.layers)],
        )
        return
    _show_on_model(loaded, model, tokens)


def _show_on_model(plan: Plan, model: str, tokens: int | None) -> None:
    """Every layer's attention (local with its window, or global), methods and the tokens it keeps entering decode
    after a prompt of `tokens`, against FullKV's; the totals in tokens and bytes; the window notes."""
    from polykv.kv_memory import fullkv_tokens, kept_line, layer_tokens, window_notes
    from polykv.models import config_dimensions

    dims = config_dimensions(model)
    length = tokens or dims.context_length or 4096
    windows = dims.windows or (None,) * plan.num_layers
    kept = [entering for entering, _ in layer_tokens(plan, length, windows=windows)]
    full = fullkv_tokens(length, windows)
    rows = [
        (str(i), "global" if w is None else f"local {w}", str(lp.prefill), str(lp.decode), f"{k:.0f}", f"{f:.0f}")
        for i, (lp, w, k, f) in enumerate(zip(plan.layers, windows, kept, full))
    ]
    local = sum(w is not None for w in windows)
    typer.echo(
        f"on {model}: {plan.num_layers} layers, {local} local (sliding window) and {plan.num_layers - local} global; "
        f"KV kept per KV head after a {length:,}-token prompt"
    )
    _table(("layer", "attention", "prefill", "decode", "kept", "fullkv"), rows)
    typer.echo(f"total: {kept_line(plan, length, windows, dims.kv_token_bytes)}")
    for note in window_notes(plan, windows):
        typer.echo(f"note: {note}")


def plan_validate(
    path: Path,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Check the layer count of this model.")] = None,
    layers: Annotated[int | None, typer.Option(help="Check against this layer count instead of a model.")] = None,
) -> None:
    """Check a plan: methods known and phase-compatible, capacities, parameters, layer count."""
    from polykv.methods import validate_plan
    from polykv.models import config_dimensions

    loaded = Plan.load(path)
    dims = config_dimensions(model) if model and layers is None else None
    num_layers = layers if layers is not None else (dims.num_layers if dims else None)
    validate_plan(loaded, num_layers, dims.context_length if dims else None, within_context=True)
    against = f" for a {num_layers}-layer model" if num_layers is not None else ""
    typer.echo(f"ok: {path} is a valid plan{against} ({loaded.num_layers} layers, scope {loaded.scope.value})")
    if dims is not None and dims.windows:
        from polykv.kv_memory import window_notes

        for note in window_notes(loaded, dims.windows):
            typer.echo(f"note: {note}")


def plan_homogeneous(
    method: str,
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the plan.")],
    capacity: Annotated[int | None, typer.Option(help="Capacity of every layer: retained tokens per KV head.")] = None,
    layers: Annotated[int | None, typer.Option(help="Number of layers (default: the model's).")] = None,
    model: ModelOption = "demo",
    scope: Scope = Scope.BOTH,
    param: Annotated[
        list[str] | None, typer.Option("--param", "-P", help="Method parameter NAME=VALUE (repeatable).")
    ] = None,
    allocation: Annotated[
        str,
        typer.Option(
            help="'fixed' (same capacity everywhere), 'native' (the method's own per-layer capacities) or 'cake' "
            "(CAKE's layer rule for any method, decided at run time from the prompt; --rule-param sets its "
            "window, gamma, tau1, tau2, kernel_size)."
        ),
    ] = "fixed",
    rule: Annotated[
        str | None,
        typer.Option(
            help="Split the budget (capacity x layers) over the layers by an allocation rule, for any method: "
            "'uniform', 'pyramid' (PyramidKV's layer rule), 'squeeze' (SqueezeAttention's, measured on 4 "
            "calibration sequences of --prompt-tokens tokens: loads the model), 'entropy' or 'ppl' (proportional to "
            "each layer's attention entropy or PPL sensitivity in --profile)."
        ),
    ] = None,
    rule_param: Annotated[
        list[str] | None,
        typer.Option(
            "--rule-param",
            help="Rule parameter NAME=VALUE (pyramid: window, beta; squeeze: squeezed; --allocation cake: window, "
            "gamma, tau1, tau2, kernel_size).",
        ),
    ] = None,
    prompt_tokens: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="With --rule: the prompt length the rule plans for (pyramid clips; squeeze measures its calibration "
            "sequences at this length, default 1024).",
        ),
    ] = None,
    profile: Annotated[
        Path | None,
        typer.Option(help="With --rule entropy or ppl: the profile directory whose statistics split the budget."),
    ] = None,
    heads: Annotated[
        str,
        typer.Option(
            help="How each layer's budget splits over its KV heads: 'uniform' (each keeps the capacity) or 'adakv' "
            "(Ada-KV: the best capacity x heads scores across the heads, at the prefill cut and at every decode step)."
        ),
    ] = "uniform",
    alpha_safeguard: Annotated[
        float | None,
        typer.Option(help="With --heads adakv: the share of the capacity every head keeps of its own best (0.2)."),
    ] = None,
) -> None:
    """Write a plan with one method in every layer: uniform capacity, the method's native per-layer capacities, or
    the capacities an allocation rule gives (`--rule`)."""
    from polykv.methods import validate_plan
    from polykv.methods.head_budgets import HEAD_RULES

    num_layers = layers if layers is not None else _num_layers(model)
    plan = Plan.homogeneous(method, capacity, num_layers, scope, _parse_params(param or []), allocation=allocation)
    if rule is not None:
        from polykv.models import config_dimensions
        from polykv.routing.rules import apply_rule

        windows = config_dimensions(model).windows if layers is None else None
        statistics = _squeeze_statistics(model, prompt_tokens or 1024) if rule == "squeeze" else None
        if rule in ("entropy", "ppl"):
            statistics = _profile_statistics(rule, profile, model, plan)
        elif profile is not None:
            raise ValueError("--profile goes with --rule entropy or ppl")
        plan = apply_rule(plan, rule, _parse_params(rule_param or []), prompt_tokens, windows or None, statistics)
    elif allocation == "cake" and rule_param and prompt_tokens is None:
        plan = plan.model_copy(update={"allocation_params": _parse_params(rule_param)})
    elif rule_param or prompt_tokens is not None:
        raise ValueError("--rule-param goes with --rule or --allocation cake, --prompt-tokens with --rule")
    if heads not in HEAD_RULES:
        raise ValueError(f"--heads: {heads!r} is not a head rule ({', '.join(HEAD_RULES)})")
    if alpha_safeguard is not None and heads != "adakv":
        raise ValueError("--alpha-safeguard goes with --heads adakv")
    if heads != "uniform":
        params = {} if alpha_safeguard is None else {"alpha_safeguard": alpha_safeguard}
        update = {"name": f"{plan.name}-{heads}", "head_allocation": heads, "head_allocation_params": params}
        plan = plan.model_copy(update=update)
    built = validate_plan(plan, num_layers)
    built.save(out)
    if layers is None:
        echo_budget_lines(built, model)
    typer.echo(f"wrote {out}")


def _profile_statistics(rule: str, profile: Path | None, model: str, plan: Plan) -> dict[str, list[float]]:
    """Per active phase, the per-layer statistic the profile rule splits by (entropy: the same in every phase)."""
    from polykv.cli.common import _profile_for
    from polykv.routing.allocation import ppl_sensitivity

    if profile is None:
        raise ValueError(f"--rule {rule} splits by a profile's statistics: give --profile DIR")
    loaded = _profile_for(profile, model)
    if rule == "entropy":
        return {phase.value: list(loaded.entropy) for phase in plan.scope.phases}
    return {phase.value: ppl_sensitivity(loaded.table, phase) for phase in plan.scope.phases}


def plan_export(
    plan: Annotated[Path, typer.Argument(help="Plan file (JSON).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the Python file.")],
    tokens: Annotated[int, typer.Option(min=1, help="The prompt length the press is for (kvpress keeps a share).")],
    to: Annotated[str, typer.Option(help="The library: kvpress.")] = "kvpress",
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="The plan's model: one with sliding-window layers is refused.")
    ] = None,
) -> None:
    """Write a short Python file that builds the kvpress press equivalent to a plan at a prompt of --tokens tokens:
    one kvpress scorer in the prefill phase, per-layer capacities (PerLayerCompressionPress); refused in one line
    where kvpress cannot express the plan."""
    from polykv.files import atomic_write_text
    from polykv.kvpress_export import kvpress_source

    if to != "kvpress":
        raise ValueError(f"--to {to!r}: PolyKV exports to kvpress only")
    windows = None
    if model is not None:
        from polykv.models import config_dimensions

        windows = config_dimensions(model).windows or None
    source = kvpress_source(Plan.load(plan), tokens, windows)  # every refusal before anything is written
    atomic_write_text(out, source)
    typer.echo(f"wrote {out}")


def _squeeze_statistics(model_name: str, tokens: int) -> list[float]:
    """SqueezeAttention's per-layer attention similarity on 4 calibration sequences of `tokens` tokens."""
    from polykv.models import load_model
    from polykv.profile.squeeze import calibration_similarity

    return calibration_similarity(model_name, *load_model(model_name), tokens)


def import_llama2c_command(
    checkpoint: Path, tokenizer: Path, out: Annotated[Path, typer.Option("--out", "-o")]
) -> None:
    """Convert a llama2.c checkpoint (+ tok*.bin tokenizer) into a Hugging Face model directory."""
    from polykv.models import import_llama2c

    typer.echo(f"wrote {import_llama2c(checkpoint, tokenizer, out)}")
