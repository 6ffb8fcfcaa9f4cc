"""deploy/: the host scripts make a token-authenticated Ray cluster as the README says (two "hosts" here: two
raylets with their own HOME, so their own ~/.ray/auth_token), and the `ray up` config is valid for Ray."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from launch.cluster import free_port

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # NOTE: one Ray cluster on the host at a time
REPO = Path(__file__).resolve().parents[2]


def run(script: str, home: Path, *args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "deploy" / "hosts" / script), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "HOME": str(home), **env})


def test_head_and_worker_scripts_make_a_two_host_cluster_with_token_auth(tmp_path):
    head_home, worker_home = tmp_path / "head", tmp_path / "worker"
    head_home.mkdir(), worker_home.mkdir()
    port = str(free_port("127.0.0.1"))
    try:
        head = run("start-head.sh", head_home, RAY_PORT=port, RAY_NUM_CPUS="1")
        assert head.returncode == 0, head.stderr
        token = head_home / ".ray" / "auth_token"
        assert token.stat().st_size > 0
        refused = run("start-worker.sh", worker_home, f"127.0.0.1:{port}", RAY_NUM_CPUS="1")
        assert refused.returncode == 2 and "auth_token" in refused.stderr  # NOTE: no token: not joined
        joined = run("start-worker.sh", worker_home, f"127.0.0.1:{port}", str(token), RAY_NUM_CPUS="1")
        assert joined.returncode == 0, joined.stderr
        status = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c",
                                 f"import ray; ray.init(address='127.0.0.1:{port}', logging_level='ERROR'); "
                                 "print(sum(n['Alive'] for n in ray.nodes()))"],
                                capture_output=True, text=True, timeout=60,
                                env={**os.environ, "HOME": str(head_home), "RAY_AUTH_MODE": "token"})
        assert status.stdout.strip().splitlines()[-1] == "2", status.stderr
    finally:
        for home in (worker_home, head_home):
            run("stop.sh", home)


def test_the_ray_up_config_is_valid_and_copies_the_checkout_and_the_token():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((REPO / "deploy" / "ray-cluster.yaml").read_text())
    validate_config(prepare_config(config))
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token" and config["file_mounts"]["~/corun"]
    assert all("RAY_AUTH_MODE=token" in " ".join(config[key]) for key in ("head_start_ray_commands",
                                                                          "worker_start_ray_commands"))
    assert shutil.which("bash")
