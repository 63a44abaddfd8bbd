"""Racing promotions from real parallel processes: exactly one wins each race, the others get
ConcurrentUpdateError, no audit event is lost, and the pointer agrees with the audit log.
Runs on SQLite (BEGIN IMMEDIATE + busy timeout) and PostgreSQL (row locks)."""

from __future__ import annotations

import multiprocessing
import os

import pytest
from govstate import record_validation, register_versions

from pgroles import as_user
from specreg.api import Registry
from specreg.errors import ConcurrentUpdateError, NotFoundError
from specreg.registry.governance.pointer_moves import UNCHANGED

PROCESSES = 8
ROUNDS = 20
BARRIER_TIMEOUT_S = 120


def contender(db_url: str, policy_path: str, version: int, barrier, results) -> None:
    """One process: each round, read the staging holder, wait for all, then promote its version."""
    registry = Registry(as_user(db_url, f"worker{version}"), user=f"worker{version}")
    for round_index in range(ROUNDS):
        barrier.wait(BARRIER_TIMEOUT_S)
        try:
            expected = registry.get("race@staging").version
        except NotFoundError:
            expected = None
        barrier.wait(BARRIER_TIMEOUT_S)  # everyone has read the same holder: now race
        try:
            move = registry.promote(f"race@{version}", "staging", expected_holder=expected,
                                    reason=f"round {round_index}")
            # this process's version already held staging: a no-op, nothing recorded
            outcome = "holds" if move.action == UNCHANGED else "won"
        except ConcurrentUpdateError:
            outcome = "conflict"
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
            outcome = f"error {type(exc).__name__}: {exc}"
        results.put((round_index, version, outcome))


@pytest.mark.slow
def test_racing_promotes_exactly_one_wins_each_round(db_url, tiny_models, policy_file):
    registry = Registry(as_user(db_url, "alice"), user="alice")
    refs = register_versions(registry, tiny_models, "race", PROCESSES)
    for ref in refs:
        record_validation(registry, ref)
    events_before = registry.verify_audit()[0]
    registry.store.engine.dispose()  # children open their own connections

    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(PROCESSES), context.Queue()
    workers = [context.Process(target=contender, args=(db_url, str(policy_file), v, barrier, results))
               for v in range(1, PROCESSES + 1)]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=BARRIER_TIMEOUT_S) for _ in range(PROCESSES * ROUNDS)]
    for worker in workers:
        worker.join(30)
        assert worker.exitcode == 0

    errors = [o for o in outcomes if o[2].startswith("error")]
    assert not errors, errors[:3]
    winners = {}
    for round_index, version, outcome in outcomes:
        if outcome == "won":
            assert round_index not in winners, f"two winners in round {round_index}"
            winners[round_index] = version
    assert sorted(winners) == list(range(ROUNDS))  # exactly one winner per round
    assert sum(o[2] == "conflict" for o in outcomes) >= ROUNDS * (PROCESSES - 2)

    history = Registry(db_url).history("race")
    promotes = [e for e in history if e.action == "promote"]
    assert [e.version for e in promotes] == [winners[r] for r in range(ROUNDS)]  # no event lost, none extra
    assert [e.actor for e in promotes] == [f"worker{winners[r]}" for r in range(ROUNDS)]
    assert [e.details["previous_version"] for e in promotes] == [None] + [winners[r] for r in range(ROUNDS - 1)]
    releases = [e for e in history if e.action == "release"]
    assert len(releases) == ROUNDS - 1
    assert Registry(db_url).get("race@staging").version == promotes[-1].version
    checked, problem = Registry(db_url).verify_audit()
    assert problem is None and checked == events_before + ROUNDS + len(releases)
