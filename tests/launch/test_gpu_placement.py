"""`corun serve --device cuda` places each node on a GPU (a list per role; nodes may share one, each with its own
KV budget), locally through CUDA_VISIBLE_DEVICES and on Ray through GPU bundles or fractions of one."""

import pytest

from launch import cluster as launch
from launch import local
from launch.cluster import ClusterConfig
from wire.config import EngineConfig

CUDA = EngineConfig(model="m", device="cuda")


def test_each_node_gets_its_role_s_gpu_and_kv_budget():
    config = ClusterConfig(CUDA, num_prefill=2, num_decode=1, prefill_gpus=("0", "1"), decode_gpus=("1",),
                           prefill_kv_cache_mib=2048, decode_kv_cache_mib=60000)
    assert [launch.node_gpu(config, "prefill", i) for i in range(2)] == ["0", "1"]
    assert launch.node_gpu(config, "decode", 0) == "1"
    assert launch.node_engine(config, "prefill", 1).cache.memory_budget_bytes == 2048 * 2**20
    assert launch.node_engine(config, "decode", 1).cache.memory_budget_bytes == 60000 * 2**20
    shared = ClusterConfig(CUDA, num_prefill=3, prefill_gpus=("2",))
    assert {launch.node_gpu(shared, "prefill", i) for i in range(3)} == {"2"}  # NOTE: one GPU for all three
    default = ClusterConfig(CUDA)
    assert launch.node_gpu(default, "decode", 0) is None
    assert launch.node_engine(default, "decode", 1).cache == CUDA.cache


@pytest.mark.parametrize("settings, message", [
    ({"num_prefill": 2, "prefill_gpus": ("0", "1", "2")}, "names 3 GPUs for 2 prefill nodes"),
    ({"decode_gpus": ("first",)}, "must be GPU indices"),
    ({"engine": EngineConfig(model="m"), "decode_gpus": ("0",)}, "--decode-gpus needs --device cuda"),
    ({"decode_kv_cache_mib": 0}, "decode_kv_cache_mib must be >= 1"),
])
def test_bad_placements_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        ClusterConfig(**{"engine": CUDA, **settings})


def test_the_local_launcher_starts_each_node_on_its_gpu(monkeypatch):
    started = []

    class Recorder:
        def __init__(self, argv, env=None):
            started.append((argv, env))

    monkeypatch.setattr(local.subprocess, "Popen", Recorder)
    cluster = local.LocalCluster(ClusterConfig(CUDA, num_decode=2, prefill_gpus=("1",), decode_gpus=("0", "1"),
                                               decode_kv_cache_mib=512))
    for role, index in cluster.config.nodes():
        cluster.start_node(role, index)
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env in started] == ["1", "0", "1"]
    decode_argv = started[1][0]
    assert decode_argv[decode_argv.index("--kv-cache-mib") + 1] == "512"
    assert decode_argv[decode_argv.index("--device") + 1] == "cuda"
    assert cluster.envs["decode-1"]["CUDA_VISIBLE_DEVICES"] == "1"  # NOTE: what a restart reuses


def test_ray_nodes_reserve_a_gpu_or_a_fraction_of_one():
    from launch.ray_cluster import RayClusterConfig

    half = RayClusterConfig(ClusterConfig(CUDA), gpus_per_node=0.5)
    assert half.bundles() == [{"CPU": 1.0, "GPU": 0.5}, {"CPU": 1.0, "GPU": 0.5}]
    with pytest.raises(ValueError, match="gpus_per_node must be in"):
        RayClusterConfig(ClusterConfig(CUDA), gpus_per_node=2)
    with pytest.raises(ValueError, match="Ray picks each node's GPU"):
        RayClusterConfig(ClusterConfig(CUDA, prefill_gpus=("0",)))


def test_nodes_on_one_gpu_split_its_kv_memory_by_role_where_it_is_sized_on_the_gpu():
    one_gpu = ClusterConfig(CUDA)  # NOTE: 1P1D on the launching process' GPU
    assert launch.gpu_kv_split(one_gpu, "prefill", 0) == (2, 0.125)
    assert launch.gpu_kv_split(one_gpu, "decode", 0) == (2, 0.875)
    decode = launch.node_engine(one_gpu, "decode", 1, (2, 0.875)).cache
    assert (decode.gpu_nodes, decode.gpu_kv_share, decode.gpu_memory_utilization) == (2, 0.875, 0.9)
    apart = ClusterConfig(CUDA, num_decode=2, prefill_gpus=("0",), decode_gpus=("1", "2"))
    assert [launch.gpu_kv_split(apart, role, i) for role, i in apart.nodes()] == [(1, 1.0)] * 3
    three = ClusterConfig(CUDA, num_prefill=0, num_decode=0, num_colocated=3, colocated_gpus=("4",))
    assert launch.gpu_kv_split(three, "colocated", 1) == (3, pytest.approx(1 / 3))
    assert launch.gpu_kv_split(three, "colocated", 3) == (4, 0.25)  # NOTE: one added at run time
    shared = ClusterConfig(CUDA, num_prefill=2, num_decode=1, num_colocated=1)
    assert sum(launch.gpu_kv_split(shared, role, i)[1] for role, i in shared.nodes()) == pytest.approx(1)
    # the inverse: a budget given in MiB, or a CPU engine, is not split
    given = ClusterConfig(CUDA, decode_kv_cache_mib=60000)
    assert launch.node_engine(given, "decode", 1, (2, 0.875)).cache.gpu_kv_share == 1.0
    assert launch.gpu_kv_split(ClusterConfig(EngineConfig(model="m")), "decode", 0) == (1, 1.0)


def test_the_local_launcher_hands_each_node_on_a_shared_gpu_its_part(monkeypatch):
    started = []

    class Recorder:
        def __init__(self, argv, env=None):
            started.append(argv)

    def parts():
        return [(int(argv[argv.index("--gpu-nodes") + 1]), float(argv[argv.index("--gpu-kv-share") + 1]))
                for argv in started]

    monkeypatch.setattr(local.subprocess, "Popen", Recorder)
    for config, expected in ((ClusterConfig(CUDA, decode_gpus=("1",)), [(1, 1.0), (1, 1.0)]),
                             (ClusterConfig(CUDA), [(2, 0.125), (2, 0.875)]),
                             (ClusterConfig(CUDA, decode_gpus=("0",)), [(2, 0.125), (2, 0.875)])):
        started.clear()
        cluster = local.LocalCluster(config)
        for role, index in cluster.config.nodes():
            cluster.start_node(role, index)
        assert parts() == expected  # NOTE: the default GPU counts as GPU 0
