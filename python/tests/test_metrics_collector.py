"""eplb.metrics.collector(migrator): a registry scrape after real migrations (2 gloo ranks) yields
the metric names of `eplb run --metrics`, with values equal to the rounds' reports; also the
collector's arithmetic on hand-made reports (no processes)."""
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import eplb
import eplb.metrics
from spawned import run_ranks

NAMES = {"eplb_rebalances": "counter", "eplb_bytes_moved": "counter", "eplb_layer_retries": "counter",
         "eplb_layer_failures": "counter", "eplb_balancedness": "gauge", "eplb_layer_commit_seconds": "histogram",
         "eplb_serving_stall_seconds": "histogram", "eplb_transfer_seconds": "histogram"}


def scrape(registry) -> dict:
    """{sample name + sorted labels: value} of the registry's exposition text, families checked."""
    text = generate_latest(registry).decode()
    families = list(text_string_to_metric_families(text))
    assert {family.name: family.type for family in families} == NAMES
    assert all(family.documentation for family in families)
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in families for sample in family.samples}


def migrate_and_scrape(rank: int, world: int) -> dict:
    """A sync round, a failed sync round and an async round, all observed by one collector."""
    import async_cases as cases
    from migration_cases import fill, make_weights

    old, new = cases.placements(world, 31)
    weights = make_weights(cases.LAYERS, cases.SLOTS, "plain")
    fill(weights, old, rank)
    registry = CollectorRegistry()
    migrator = eplb.Migrator(weights, timeout=20, retries=1)
    collector = eplb.metrics.collector(migrator, registry)
    reports = [migrator.migrate(old, new)["layers"]]
    handle = migrator.start(new, old)
    steps = 0
    while not handle.done:
        handle.commit_ready()
        steps += 1
    reports.append(handle.report()["layers"])
    collector.set_balancedness(0.5, 0.875)
    return {"scrape": [[list(key), value] for key, value in scrape(registry).items()], "reports": reports,
            "steps": steps}


def test_a_scrape_after_real_migrations_matches_their_reports(tmp_path):
    for result in run_ranks(tmp_path, 2, migrate_and_scrape):
        values = {(name, tuple(tuple(label) for label in labels)): value for (name, labels), value in result["scrape"]}
        layers = [layer for report in result["reports"] for layer in report]
        changed = [layer for layer in layers if layer["changed"]]
        committed = [layer for layer in changed if layer["committed"]]
        assert values[("eplb_rebalances_total", ())] == 2
        for locality in ("local", "intra_node", "inter_node"):
            assert values[("eplb_bytes_moved_total", (("locality", locality),))] == \
                sum(layer[f"bytes_{locality}"] for layer in committed)
        assert sum(layer["bytes_local"] + layer["bytes_intra_node"] for layer in committed) > 0
        assert values[("eplb_layer_retries_total", ())] == sum(layer["retries"] for layer in layers)
        assert values[("eplb_balancedness", (("when", "before"),))] == 0.5
        assert values[("eplb_balancedness", (("when", "after"),))] == 0.875
        assert values[("eplb_layer_commit_seconds_count", ())] == len(committed) > 0
        assert values[("eplb_layer_commit_seconds_sum", ())] == pytest.approx(
            sum(layer["seconds_commit"] for layer in committed))
        assert values[("eplb_transfer_seconds_count", ())] == len(changed)
        assert values[("eplb_transfer_seconds_bucket", (("le", "+Inf"),))] == len(changed)
        # One stall observation per commit_ready() call of the async round.
        assert values[("eplb_serving_stall_seconds_count", ())] == result["steps"] > 0


def layer(number, *, committed=True, failure="", failure_code="", retries=0, transfer=0.003, commit=0.0002):
    return {"layer": number, "changed": True, "committed": committed, "bytes_local": 10, "bytes_intra_node": 100,
            "bytes_inter_node": 1000, "retries": retries, "failure": failure, "failure_code": failure_code,
            "seconds_transfer": transfer, "seconds_commit": commit}


def test_the_collector_adds_up_rounds_and_labels_failures_by_code():
    registry = CollectorRegistry()
    made = eplb.metrics.MigratorCollector()
    registry.register(made)
    made.observe_round([layer(0), layer(1, committed=False, failure="attempt 2: ...", failure_code="remote disconnect",
                                         retries=1, transfer=0.5)])
    made.observe_round([layer(0, failure="attempt 1: ...", failure_code="I/O error", retries=1, commit=0.004)])
    made.observe_stall(0.00002)
    values = scrape(registry)
    assert values[("eplb_rebalances_total", ())] == 2
    assert values[("eplb_bytes_moved_total", (("locality", "inter_node"),))] == 2000
    assert values[("eplb_layer_retries_total", ())] == 2
    assert values[("eplb_layer_failures_total", (("code", "remote_disconnect"),))] == 1
    assert values[("eplb_layer_failures_total", (("code", "io_error"),))] == 1
    assert values[("eplb_layer_commit_seconds_bucket", (("le", "0.0001"),))] == 0
    assert values[("eplb_layer_commit_seconds_bucket", (("le", "0.00025"),))] == 1
    assert values[("eplb_layer_commit_seconds_bucket", (("le", "0.005"),))] == 2
    assert values[("eplb_transfer_seconds_bucket", (("le", "0.5"),))] == 3
    assert values[("eplb_transfer_seconds_bucket", (("le", "0.25"),))] == 2
    assert values[("eplb_serving_stall_seconds_bucket", (("le", "2.5e-05"),))] == 1
    assert not any(name == "eplb_balancedness" for name, _ in values)  # unknown until set_balancedness()


def test_collector_refuses_what_is_not_a_migrator():
    with pytest.raises(eplb.Error, match="needs an eplb.Migrator"):
        eplb.metrics.collector(object(), None)
