"""The launchers' restart policy: at once after a long run, doubling waits after quick deaths, then giving up."""

from launch.restarts import RestartPolicy


def test_a_node_that_ran_long_is_restarted_at_once():
    policy = RestartPolicy()
    policy.started("decode-0", now=0.0)
    assert policy.decide("decode-0", "exit code -9", now=100.0) == "restart"
    policy.started("decode-0", now=100.0)
    assert policy.decide("decode-0", "exit code -9", now=300.0) == "restart"


def test_quick_deaths_back_off_doubling_then_give_up(caplog):
    policy = RestartPolicy(quick_exit_s=10.0, first_wait_s=0.5, max_quick_exits=4)
    now, waits = 0.0, []
    policy.started("prefill-0", now=now)
    while True:
        now += 1.0  # NOTE: it dies a second after each start
        first_seen = now
        decision = policy.decide("prefill-0", "exit code 2", now=now)
        while decision == "wait":
            now += 0.25
            decision = policy.decide("prefill-0", "exit code 2", now=now)
        if decision == "give_up":
            break
        waits.append(now - first_seen)
        policy.started("prefill-0", now=now)
    assert waits == [0.5, 1.0, 2.0]
    assert policy.decide("prefill-0", "exit code 2", now=now + 1000) == "give_up"
    assert "giving up on prefill-0: it exited 4 times in a row" in caplog.text and "exit code 2" in caplog.text


def test_a_long_run_resets_the_count():
    policy = RestartPolicy(max_quick_exits=2, first_wait_s=0.0)
    policy.started("d", now=0.0)
    assert policy.decide("d", "x", now=1.0) == "restart"  # NOTE: one quick exit
    policy.started("d", now=1.0)
    assert policy.decide("d", "x", now=500.0) == "restart"  # NOTE: a long run: the count starts over
    policy.started("d", now=500.0)
    assert policy.decide("d", "x", now=501.0) == "restart"
    policy.started("d", now=501.0)
    assert policy.decide("d", "x", now=502.0) == "give_up"
