"""The README's test command (`-n 2 --dist loadgroup`) keeps each module on one worker, so that a module's fixtures
(clusters) start once and its tests run in order; the Ray modules share one worker. pytest-xdist names a test's group
in its node id ("...@group"): if a pytest or xdist upgrade loses that suffix, the groups fall apart silently."""

import pytest


def test_under_loadgroup_this_test_carries_its_module_group(request):
    if not request.config.getoption("loadgroup", default=False):
        pytest.skip("not run under pytest-xdist's --dist loadgroup")
    assert request.node.nodeid.endswith("@" + request.node.nodeid.split("::")[0].split("@")[0]), request.node.nodeid
