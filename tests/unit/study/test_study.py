"""Study expansion with nodes and job resources, and the resources a cell's job asks for."""

import copy

import pytest

from dpstudy.study import sweeps
from dpstudy.study.resources import (
    comm_bench_gpus,
    comm_world_sizes,
    plan_gpus,
    rank_capacity,
    requests_gpus,
    train_resources,
)
from dpstudy.util.errors import ConfigError

STUDY = {
    "study": "nodes_test",
    "resources": {"mem_mb_per_process": 3000},
    "sweeps": [
        {
            "name": "scale",
            "dataset": "synthetic",
            "model": "lenet",
            "grid": {
                "mode": ["single", "dp", "ddp"],
                "gpus": [1, 2],
                "nodes": [1, 2],
                "batch": [64],
                "backend": ["gloo"],
            },
            "resources": {"runtime_min": 5},
        },
        {"name": "plain", "dataset": "synthetic", "model": "lenet", "grid": {"mode": ["single"], "batch": [32]}},
    ],
}


def cells(config=STUDY):
    return {c.id: c for c in sweeps.expand(sweeps.load(config))}


def test_single_and_dp_stay_on_one_node_and_only_multi_node_ids_say_nodes():
    ids = set(cells())
    assert ids == {
        "synthetic-lenet-single-g1-b64-none",
        "synthetic-lenet-dp-g1-b64-none",
        "synthetic-lenet-dp-g2-b64-none",
        "synthetic-lenet-ddp-g1-b64-gloo",
        "synthetic-lenet-ddp-g2-b64-gloo",
        "synthetic-lenet-ddp-g1-b64-gloo-nodes2",
        "synthetic-lenet-ddp-g2-b64-gloo-nodes2",
        "synthetic-lenet-single-g1-b32-none",
    }
    assert cells()["synthetic-lenet-ddp-g2-b64-gloo-nodes2"].spec["nodes"] == 2


def test_sweep_resources_override_the_study_and_defaults_fill_the_rest():
    by_id = cells()
    assert by_id["synthetic-lenet-ddp-g1-b64-gloo"].resources == {
        "mem_mb_per_process": 3000,
        "mem_mb_per_job": 1000,
        "runtime_min": 5,
        "collective_timeout_min": 5,
    }
    assert by_id["synthetic-lenet-single-g1-b32-none"].resources == {
        "mem_mb_per_process": 3000,
        "mem_mb_per_job": 1000,
        "runtime_min": 60,
        "collective_timeout_min": 5,
    }


def test_a_sweep_may_set_its_own_repeats_which_name_the_repeat_only():
    config = copy.deepcopy(STUDY)
    config["defaults"] = {"repeats": 3}
    config["sweeps"][1]["set"] = {"repeats": 2, "epochs": 5}
    ids = sorted(i for i in cells(config) if "-b32-" in i)
    assert ids == ["synthetic-lenet-single-g1-b32-none-epochs5-r0", "synthetic-lenet-single-g1-b32-none-epochs5-r1"]
    assert sum("-b64-" in i for i in cells(config)) == 7 * 3  # the other sweep keeps the default


def test_only_fsdp_cells_take_a_shard_and_name_it_where_the_sweep_sets_it():
    strategies = {
        "study": "strategies_test",
        "sweeps": [
            {
                "name": "shardings",
                "dataset": "synthetic",
                "model": "lenet",
                "grid": {
                    "mode": ["single", "ddp", "fsdp"],
                    "gpus": [1, 2],
                    "backend": ["gloo"],
                    "shard": ["full", "grad_op"],
                },
            },
            {
                "name": "plain",
                "dataset": "synthetic",
                "model": "lenet",
                "grid": {"mode": ["fsdp"], "gpus": [2], "backend": ["gloo"]},
            },
        ],
    }
    by_id = cells(strategies)
    assert set(by_id) == {
        "synthetic-lenet-single-g1-b64-none",
        "synthetic-lenet-ddp-g1-b64-gloo",
        "synthetic-lenet-ddp-g2-b64-gloo",
        "synthetic-lenet-fsdp-g1-b64-gloo-shardfull",
        "synthetic-lenet-fsdp-g2-b64-gloo-shardfull",
        "synthetic-lenet-fsdp-g1-b64-gloo-shardgrad_op",
        "synthetic-lenet-fsdp-g2-b64-gloo-shardgrad_op",
        "synthetic-lenet-fsdp-g2-b64-gloo",  # a sweep that does not set shard: full, and not in the id
    }
    shards = {cell_id: c.spec["shard"] for cell_id, c in by_id.items()}
    assert shards["synthetic-lenet-ddp-g2-b64-gloo"] == shards["synthetic-lenet-single-g1-b64-none"] == "none"
    assert shards["synthetic-lenet-fsdp-g2-b64-gloo"] == shards["synthetic-lenet-fsdp-g2-b64-gloo-shardfull"] == "full"
    assert shards["synthetic-lenet-fsdp-g2-b64-gloo-shardgrad_op"] == "grad_op"
    # one process per device, like ddp: the same job
    fsdp, ddp = by_id["synthetic-lenet-fsdp-g2-b64-gloo"], by_id["synthetic-lenet-ddp-g2-b64-gloo"]
    assert train_resources(fsdp.spec, fsdp.resources, False) == train_resources(ddp.spec, ddp.resources, False)
    assert train_resources(fsdp.spec, fsdp.resources, False)["mem_mb"] == 2 * 4000 + 1000  # 2 processes


def test_ddps_knobs_reach_only_ddp_cells_and_name_them_where_the_sweep_sets_them():
    config = {
        "study": "knobs",
        "sweeps": [
            {
                "name": "buckets",
                "dataset": "synthetic",
                "model": "lenet",
                "grid": {"mode": ["ddp", "fsdp"], "gpus": [2], "batch": [64], "backend": ["gloo"]},
                "set": {"static_graph": True},
            },
            {
                "name": "caps",
                "dataset": "synthetic",
                "model": "lenet",
                "grid": {"mode": ["ddp"], "gpus": [2], "batch": [64], "backend": ["gloo"], "bucket_cap_mb": [1, 2.5]},
            },
            {"name": "one", "dataset": "synthetic", "model": "lenet", "grid": {"mode": ["single"], "batch": [64]}},
        ],
    }
    by_id = cells(config)
    assert set(by_id) == {
        "synthetic-lenet-ddp-g2-b64-gloo-static_graph1",
        "synthetic-lenet-fsdp-g2-b64-gloo",  # the sweep's static_graph is DDP's: not this cell's, not in its id
        "synthetic-lenet-ddp-g2-b64-gloo-bucket_cap_mb1",
        "synthetic-lenet-ddp-g2-b64-gloo-bucket_cap_mb2p5",
        "synthetic-lenet-single-g1-b64-none",
    }
    assert by_id["synthetic-lenet-ddp-g2-b64-gloo-static_graph1"].spec["static_graph"] is True
    assert by_id["synthetic-lenet-fsdp-g2-b64-gloo"].spec["static_graph"] is None
    assert by_id["synthetic-lenet-ddp-g2-b64-gloo-bucket_cap_mb2p5"].spec["bucket_cap_mb"] == 2.5
    # a knob left null stays out of the job's params: a cell made before the knobs existed reruns not
    assert "bucket_cap_mb" not in by_id["synthetic-lenet-single-g1-b64-none"].params()


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda c: c["sweeps"][0]["grid"].update(mode=["single", "dp"]),
            "sweep 'scale': nodes 2 needs mode ddp, fsdp or deepspeed",
        ),
        (
            lambda c: c["sweeps"][0]["grid"].update(shard=["full"]),
            "sweep 'scale': grid.shard full needs mode fsdp in grid.mode",
        ),
        (lambda c: c["sweeps"][0]["grid"].update(shard=["zero4"]), "sweep 'scale': shard: 'zero4' is not one of"),
        (
            lambda c: c["sweeps"][1].update(set={"bucket_cap_mb": 5}),
            r"sweep 'plain': set.bucket_cap_mb needs ddp cells: DistributedDataParallel's arguments",
        ),
        (lambda c: c["sweeps"][0]["grid"].update(bucket_cap_mb=[0]), "bucket_cap_mb: 0 is less than or equal to"),
        (lambda c: c["sweeps"][0].update(set={"static_graph": "yes"}), "static_graph: 'yes' is not of type"),
        (
            lambda c: c["sweeps"][0]["grid"].update(mode=["fsdp"], backend=["none"]),
            "sweep 'scale': mode fsdp needs backend nccl or gloo",
        ),
        (lambda c: c["sweeps"][0]["grid"].update(nodes=[0]), "sweep 'scale': nodes: 0 is less than the minimum of 1"),
        (
            lambda c: c["sweeps"][0]["grid"].update(nodes=["two"]),
            "sweep 'scale': nodes: 'two' is not of type 'integer'",
        ),
        (lambda c: c["sweeps"][0].update(resources={"runtime_min": 0}), "sweep 'scale': resources.runtime_min"),
        (lambda c: c.update(resources={"gpus": 1}), "unknown key 'gpus' at resources"),
        (lambda c: c.update(request_gpus="sometimes"), "request_gpus"),
        (lambda c: c.update(bench={"floor_seconds": 0}), "bench.floor_seconds: 0 is less than or equal to"),
        (lambda c: c.update(bench={"floor": "yes"}), "bench.floor: 'yes' is not of type 'boolean'"),
        # the forecast: block, checked before any job (dpstudy.study.forecast_requests)
        (
            lambda c: c.update(forecast=[{"gpus": [4], "batch": [64], "backend": ["gloo"], "mode": ["dp"]}]),
            r"forecast #1: mode 'dp' cannot be forecast: the model forecasts ddp, fsdp",
        ),
        (
            lambda c: c.update(forecast=[{"gpus": [4], "batch": [64], "backend": ["gloo"], "shard": ["grad_op"]}]),
            r"forecast #1: shard 'grad_op' is no shard of mode ddp",
        ),
        (
            lambda c: c.update(
                forecast=[
                    {"gpus": [4], "batch": [64], "backend": ["gloo"]},
                    {"gpus": [3], "batch": [64], "backend": ["gloo"]},
                ]
            ),
            r"forecast #2: batch 64 is not divisible by gpus 3",
        ),
        (
            lambda c: c.update(forecast=[{"gpus": [4], "batch": [64], "backend": ["gloo"], "nodes": [2]}]),
            "forecast #1: nodes 2 cannot be forecast: the model knows no link between nodes",
        ),
        (lambda c: c.update(forecast=[{"gpus": [4], "batch": [64]}]), "forecast.0: 'backend' is a required property"),
        # a study written before the key was renamed is told its new name
        (
            lambda c: c.update(predict=[{"gpus": [4], "batch": [64], "backend": ["gloo"]}]),
            r"unknown key 'predict' at \(top level\) \('predict' is now 'forecast'\)",
        ),
    ],
)
def test_bad_nodes_and_resources_are_named(change, message):
    config = copy.deepcopy(STUDY)
    change(config)
    with pytest.raises(ConfigError, match=message):
        cells(config)


@pytest.mark.parametrize(
    "device, request_gpus, visible, expected",
    [
        ("auto", "auto", 0, False),
        ("auto", "auto", 2, True),
        ("cuda", "auto", 0, True),
        ("cpu", "auto", 2, False),
        ("auto", "always", 0, True),
        ("cpu", "always", 0, False),
        ("auto", "never", 2, False),
    ],
)
def test_which_studies_reserve_gpus(device, request_gpus, visible, expected):
    assert requests_gpus({"device": device, "request_gpus": request_gpus}, visible) is expected


def test_cuda_without_gpu_reservations_is_refused():
    with pytest.raises(ConfigError, match="device 'cuda' needs GPUs, but request_gpus is 'never'"):
        requests_gpus({"device": "cuda", "request_gpus": "never"}, 4)


def resources_of(cell_id, gpus):
    cell = cells()[cell_id]
    return {k: v for k, v in train_resources(cell.spec, cell.resources, gpus).items() if v is not None}


def test_one_node_gpu_job_asks_for_its_gpus_and_cores_per_gpu():
    assert resources_of("synthetic-lenet-ddp-g2-b64-gloo", gpus=True) == {
        "gpu": 2,
        "cpus_per_gpu": 1,
        "mem_mb": 7000,
        "runtime": 5,
        "limit_s": 300,
        "collective_timeout_s": 150,
        "nodes": 1,
        "node_gpus": 2,
        "node_cores": 2,
    }


def test_a_fractional_runtime_asks_schedulers_for_whole_minutes_and_the_launcher_for_seconds():
    cell = cells()["synthetic-lenet-ddp-g2-b64-gloo"]
    resources = train_resources(cell.spec, {**cell.resources, "runtime_min": 0.25}, False)
    # collectives wait at most half the limit: 7.5 s here, the default 5 min below
    assert (resources["runtime"], resources["limit_s"], resources["collective_timeout_s"]) == (1, 15, 8)
    resources = train_resources(cell.spec, {**cell.resources, "runtime_min": 90.5}, False)
    assert (resources["runtime"], resources["limit_s"], resources["collective_timeout_s"]) == (91, 5430, 300)


def test_cpu_job_asks_for_one_task_with_a_core_per_process():
    assert resources_of("synthetic-lenet-ddp-g2-b64-gloo", gpus=False) == {
        "gpu": 0,
        "cpus_per_task": 2,
        "mem_mb": 7000,
        "runtime": 5,
        "limit_s": 300,
        "collective_timeout_s": 150,
        "nodes": 1,
        "tasks": 1,
        "node_gpus": 0,
        "node_cores": 2,
    }
    # dp and single run one process, whatever their devices
    assert resources_of("synthetic-lenet-dp-g2-b64-none", gpus=True)["mem_mb"] == 4000


def test_multi_node_job_runs_a_task_per_node_with_gpus_per_node():
    assert resources_of("synthetic-lenet-ddp-g2-b64-gloo-nodes2", gpus=True) == {
        "gres": "gpu:2",
        "cpus_per_task": 2,
        "mem_mb": 7000,
        "runtime": 5,
        "limit_s": 300,
        "collective_timeout_s": 150,
        "nodes": 2,
        "tasks": 2,
        "tasks_per_gpu": 0,
        "mpi": "srun",
        "node_gpus": 2,
        "node_cores": 2,
    }
    assert resources_of("synthetic-lenet-ddp-g1-b64-gloo-nodes2", gpus=False) == {
        "cpus_per_task": 1,
        "mem_mb": 4000,
        "runtime": 5,
        "limit_s": 300,
        "collective_timeout_s": 150,
        "nodes": 2,
        "tasks": 2,
        "mpi": "srun",
        "node_gpus": 0,
        "node_cores": 1,
    }


@pytest.mark.parametrize("gpu_jobs, visible, reserved", [(False, 4, 0), (True, 0, 2), (True, 1, 1), (True, 8, 2)])
def test_the_all_reduce_benchmark_reserves_no_more_gpus_than_the_host_has(gpu_jobs, visible, reserved):
    # a 1-GPU host: the benchmark runs (NCCL at 2 ranks skipped with its reason) instead of
    # waiting for a second GPU that dpstudy.jobs.gpus cannot give it
    assert comm_bench_gpus(gpu_jobs, visible) == reserved


@pytest.mark.parametrize(
    "gpu_jobs, visible, budget, reserved",
    [(True, 1, None, 1), (True, 8, 2, 1), (True, 0, None, 0), (True, 4, 0, 0), (False, 4, 4, 0)],
)
def test_the_memory_plan_reserves_a_gpu_only_where_it_can_measure_on_one(gpu_jobs, visible, budget, reserved):
    # it measures cuDNN's workspaces on a GPU of its own: none on a login node (visible 0), in a
    # CPU study, or with --resources gpu=0 (it would wait for a GPU it can never have)
    assert plan_gpus(gpu_jobs, visible, budget) == reserved


def test_the_collectives_are_measured_at_every_world_size_run_or_forecast_that_the_host_holds():
    import copy

    config = copy.deepcopy(STUDY)
    config["sweeps"][0]["grid"].update(gpus=[1, 2, 3, 6], batch=[96])
    specs = [c.spec for c in cells(config).values()]
    over_nodes = [s for s in specs if s["nodes"] > 1]  # 3 or 6 per node on two nodes: not one host's ranks
    assert {s["gpus"] for s in over_nodes} == {1, 2, 3, 6} and comm_world_sizes(over_nodes, [], None) == [2]
    assert comm_world_sizes(specs, [4, 8], capacity=None) == [2, 3, 4, 6, 8]  # a login node: all
    assert comm_world_sizes(specs, [4, 8], capacity=4) == [2, 3, 4]
    assert comm_world_sizes(specs, [], capacity=1) == [2]  # one GPU: both ranks on it, as before
    single_only = [c.spec for c in cells(config).values() if c.spec["mode"] in ("single", "dp")]
    assert comm_world_sizes(single_only, [], capacity=8) == [2]  # dp is one process: no collective
    # what the host holds: cores in a CPU study; GPUs shown, within --resources gpu, in a GPU one
    assert rank_capacity(False, visible_gpus=8, gpu_budget=8, cores=2) == 2
    assert rank_capacity(True, visible_gpus=8, gpu_budget=4, cores=2) == 4
    assert rank_capacity(True, visible_gpus=2, gpu_budget=None, cores=64) == 2
    assert rank_capacity(True, visible_gpus=0, gpu_budget=None, cores=64) is None


def test_a_grid_keeps_exactly_the_combinations_a_spec_accepts():
    # The mode/backend/nodes/shard rules are stated once (dpstudy.study.spec.setup_gap): a sweep's grid
    # prunes by them and a spec is refused by them, so the two can never disagree.
    import itertools

    from dpstudy.study import spec as specs

    def accepted(combo: dict) -> bool:
        try:
            specs.complete({"dataset": "synthetic", "model": "lenet", **combo})
        except ConfigError:
            return False
        return True

    kept = set()
    for mode, gpus, nodes, backend, shard in itertools.product(
        ["single", "dp", "ddp", "fsdp"], [1, 2], [1, 2], ["none", "gloo", "nccl"], ["none", "full", "grad_op"]
    ):
        combo = {"mode": mode, "gpus": gpus, "nodes": nodes, "backend": backend, "batch": 64, "shard": shard}
        normalised = sweeps.normalise(combo)
        # single and dp take backend none; only fsdp shards, full unless it says grad_op
        as_run = {**combo, "backend": specs.backend_of(mode, backend), "shard": specs.shard_of(mode, shard)}
        assert (normalised is not None) == accepted(as_run), combo
        assert accepted(combo) <= (normalised == combo), combo  # a valid spec is kept as it is
        if normalised is not None:
            kept.add(tuple(sorted(normalised.items())))
    # Distinct cells: single on 1 gpu and 1 node (any grid backend and shard become none); dp on 1
    # or 2 gpus, 1 node; ddp with a real backend on any gpus and nodes; fsdp the same, either sharding.
    assert len(kept) == 1 + 2 + 2 * 2 * 2 + 2 * 2 * 2 * 2
    assert specs.complete({"dataset": "synthetic", "model": "lenet", "mode": "fsdp", "backend": "gloo"})["shard"] == (
        "full"
    )


def test_a_predict_block_is_every_combination_of_its_lists():
    from dpstudy.study import forecast_requests

    config = {
        **copy.deepcopy(STUDY),
        "forecast": [{"gpus": [4, 8], "batch": [256, 512], "backend": ["gloo"], "model": ["lenet"]}],
    }
    asked = forecast_requests.requests(sweeps.load(config))
    assert len(asked) == 4 and {(r["gpus"], r["batch"]) for r in asked} == {(4, 256), (4, 512), (8, 256), (8, 512)}
    assert all(
        r["mode"] == "ddp" and r["nodes"] == 1 and r["model"] == ["lenet"] and r["dataset"] is None for r in asked
    )
    assert {r["shard"] for r in asked} == {"none"}
    # FSDP in both shardings beside DDP, which is asked once whatever the shards
    config["forecast"] = [{"gpus": [4], "batch": [256], "backend": ["gloo"], "mode": ["ddp", "fsdp"]}]
    config["forecast"][0]["shard"] = ["full", "grad_op"]
    asked = forecast_requests.requests(sweeps.load(config))
    assert [(r["mode"], r["shard"]) for r in asked] == [("ddp", "none"), ("fsdp", "full"), ("fsdp", "grad_op")]


def test_the_resolved_study_is_written_from_a_json_configfile_too(tmp_path):
    # Snakemake reads a JSON --configfile into OrderedDicts, which yaml.safe_dump refuses: the
    # study_config job failed on benchmarks/prediction_accuracy.py's study
    from collections import OrderedDict

    import yaml

    from dpstudy.study.sweeps import write_yaml

    sweep = OrderedDict([("name", "one"), ("grid", OrderedDict([("mode", ["single"]), ("batch", (64, 128))]))])
    study = OrderedDict([("study", "json"), ("sweeps", [sweep])])
    write_yaml(study, str(tmp_path / "study.yaml"))
    assert yaml.safe_load((tmp_path / "study.yaml").read_text()) == {
        "study": "json",
        "sweeps": [{"name": "one", "grid": {"mode": ["single"], "batch": [64, 128]}}],
    }


def test_stand_in_set_shrinks_a_sweep_only_under_the_stand_in_switch():
    shrink = {"epochs": 1, "lr": 0.5}
    study = {
        "study": "shrink",
        "defaults": {"epochs": 5, "lr": 0.01},
        "sweeps": [
            {
                "name": "a",
                "dataset": "cifar10",
                "model": "lenet",
                "set": {"epochs": 7},
                "stand_in_set": shrink,
                "grid": {"mode": ["single"]},
            },
            {"name": "b", "dataset": "cifar10", "model": "lenet", "stand_in_set": shrink, "grid": {"lr": [0.2]}},
        ],
    }
    study["sweeps"][1]["grid"]["mode"] = ["single"]
    real = {c.sweep: c for c in sweeps.expand(sweeps.load(study))}
    assert (real["a"].spec["epochs"], real["a"].spec["lr"], real["a"].spec["dataset"]) == (7, 0.01, "cifar10")
    shrunk = {c.sweep: c for c in sweeps.expand(sweeps.load({**study, "stand_in": True}))}
    a = shrunk["a"].spec
    assert (a["epochs"], a["lr"], a["dataset"]) == (1, 0.5, "synthetic_rgb")
    assert shrunk["b"].spec["lr"] == 0.2 and shrunk["b"].spec["epochs"] == 1  # the grid still wins
    assert real["a"].id == "cifar10-lenet-single-g1-b64-none-epochs7"  # ids name the sweep's own keys


def test_replicate_reaches_only_hybrid_cells_and_names_them_where_the_sweep_sets_it():
    study = {
        "study": "hsdp",
        "sweeps": [
            {
                "name": "a",
                "dataset": "synthetic",
                "model": "lenet",
                "set": {"replicate": 2},
                "grid": {"mode": ["ddp", "fsdp"], "shard": ["full", "hybrid"], "gpus": [4], "backend": ["gloo"]},
            }
        ],
    }
    by_id = {c.id: c.spec for c in sweeps.expand(sweeps.load(study))}
    assert set(by_id) == {
        "synthetic-lenet-ddp-g4-b64-gloo",
        "synthetic-lenet-fsdp-g4-b64-gloo-shardfull",
        "synthetic-lenet-fsdp-g4-b64-gloo-replicate2-shardhybrid",
    }
    assert by_id["synthetic-lenet-fsdp-g4-b64-gloo-replicate2-shardhybrid"]["replicate"] == 2
    assert by_id["synthetic-lenet-fsdp-g4-b64-gloo-shardfull"]["replicate"] is None
