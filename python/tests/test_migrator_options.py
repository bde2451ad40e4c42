"""Migrator options are checked before anything else (issue 29, "Also": timeout=inf and 1e300 meant no
deadline): a timeout is None (automatic) or within the CLI's cap of a day; the refusal is a ValueError."""
import math

import pytest
import torch

import eplb


@pytest.mark.parametrize("timeout", [math.inf, 1e300, 86401, 0, -1, math.nan, "10"])
def test_a_timeout_outside_a_day_or_not_a_number_is_refused(timeout):
    with pytest.raises(ValueError, match=r"timeout must be None \(automatic\) or in \(0, 86400\]"):
        eplb.Migrator([[torch.zeros(2, 8)]], timeout=timeout)


BAD_OPTIONS = [({"retries": -1}, "retries"), ({"transport": "rdma"}, "transport"), ({"commit": "move"}, "commit"),
               ({"transfer_schedule": "nics"},
                "transfer_schedule must be off, ranks, hosts, ranks-fenced or hosts-fenced, got 'nics'"),
               ({"transfer_schedule": None}, "transfer_schedule must be a str")]


@pytest.mark.parametrize("options, word", BAD_OPTIONS)
def test_other_bad_options_are_refused_naming_the_option(options, word):
    with pytest.raises(ValueError, match=word):
        eplb.Migrator([[torch.zeros(2, 8)]], **options)
