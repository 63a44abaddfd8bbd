"""The registry's use cases, one module each: what ``specreg.Registry`` (api.py) delegates to, in
one line a method. A use case reads its inputs (usecases/inputs.py), calls the store, governance,
review or deploy parts of the registry (and the runtime's validators through
runtime_validation.py), and returns what the CLI prints; it never parses arguments or prints. Each takes the Registry as its
first argument for what every use case shares: the store, who acts (``user``), the policy of
record, the MLflow mirror and the warnings the CLI prints at exit.

    register         fingerprint the models, record version N+1
    validate         run the checks on the runtime, record the run and its baselines
    validate_engine  validate in a serving engine, record its engine baseline
    engine_baselines which engine baseline counts, accepting one, baselines in an engine's terms
    approve          signed approvals and rejections, the keyring
    policy           the policy of record: propose, approve, read
    promote          pointer moves (promote, rollback, retire), the gate
    export           deployment files and the pair lock
    observe          live acceptance against the baselines
    mirror           the MLflow review surface
    reading          versions, environments, comparisons, the audit log's coverage
    acting_user      who acts
"""
