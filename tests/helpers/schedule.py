"""How the suite is shared among pytest-xdist's workers (make test: `pytest -n 3 --waiting-lane`):
units of work (a module, or modules that share a costly session fixture), the longest first, and
a last worker, the waiting lane, that runs the units that mostly wait. A plugin of tests/conftest.py
(`pytest_plugins`)."""

from __future__ import annotations

import os

import pytest

# A test module is one unit of work; modules that share a session fixture too costly to make twice
# are one unit together.
SHARED = {
    "tests/e2e/test_default_study.py": "default_study",
    "tests/e2e/test_reruns.py": "default_study",
    "tests/e2e/test_faults.py": "default_study",
    "tests/e2e/test_cluster.py": "slurm",  # the session's private SLURM (tests/e2e/conftest.py)
    "tests/e2e/test_packs.py": "slurm",
}
# The longest units first, so that no worker starts one of them when the other is nearly done (in
# collection order the report's tests came last, and one worker ended well after the other). The
# order follows the per-module times every run prints at its end (tests/helpers/machine.py).
FIRST = (
    "default_study",
    "slurm",
    "tests/e2e/test_lm_study.py",
    "tests/unit/engine/test_train.py",
    "tests/e2e/test_own_model.py",
    "tests/e2e/test_setup.py",
    "tests/unit/models/test_vit.py",
    "tests/unit/engine/test_compile.py",
    "tests/unit/report/test_plots.py",
    "tests/unit/ext/test_ext.py",
    "tests/unit/data/test_user_data.py",
    "tests/unit/report/test_report.py",
)
# Units that mostly wait, holding a worker but not a core: for SLURM's scheduler and the minute of
# its shortest time limit, for time limits and timeouts of our own. With --waiting-lane the last
# pytest-xdist worker runs these alone, beside the others (one per core), which take the rest.
WAITING = (
    "slurm",
    "tests/unit/jobs/test_launch.py",
    "tests/unit/jobs/test_time_limit.py",
    "tests/unit/gpucheck/test_gpucheck.py",
    "tests/unit/workflow/test_wakeups.py",  # timers: 5.6 s, 1.1 CPU-s, the last unit of a CPU worker
)


def pytest_addoption(parser):
    parser.addoption(
        "--waiting-lane",
        action="store_true",
        help="pytest-xdist: the last worker runs the units that mostly wait (tests/helpers/schedule.py WAITING) and "
        "nothing else; the other workers run the rest, and the waiting units the last one has not started",
    )


def pytest_configure(config):
    named = [*SHARED, *FIRST, *WAITING]
    missing = sorted({m for m in named if m.endswith(".py") and not (config.rootpath / m).is_file()})
    if missing:  # a renamed module would silently lose its place in the schedule
        raise pytest.UsageError(f"tests/helpers/schedule.py names test modules that do not exist: {', '.join(missing)}")


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or the name its module shares in SHARED."""
    module = nodeid.split("::")[0]
    return SHARED.get(module, module)


def lane_id(workers: int) -> str:
    """The waiting lane's pytest-xdist worker: the last one."""
    return f"gw{workers - 1}"


def on_the_waiting_lane(config) -> bool:
    """In a pytest-xdist worker: whether it is the waiting lane."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    return bool(worker) and count > 1 and config.getoption("waiting_lane") and worker == lane_id(count)


def pytest_ignore_collect(collection_path, config):
    """The waiting lane imports only the modules it may run: a worker's collection of the whole suite
    is 10 CPU-s (torch with its compiler, pandas, matplotlib, assertion rewriting), the lane's own
    modules 3; measured, a run of a few tests took 3.7 s less wall and 8 CPU-s less."""
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_") and on_the_waiting_lane(config):
        return unit_of(collection_path.relative_to(config.rootpath).as_posix()) not in WAITING
    return None


def pytest_collection_modifyitems(config, items):
    """The units of FIRST first (without xdist only the order changes)."""
    rank = {unit: i for i, unit in enumerate(FIRST)}
    # stable: within a unit, and among the rest, collection order stays
    items.sort(key=lambda item: rank.get(unit_of(item.nodeid), len(FIRST)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scheduler, handing out whole units (a module's fixtures made once, on one
    worker) in collection order. Its own --dist loadgroup cannot: it marks a group by rewriting
    item._nodeid, which pytest 9 no longer reads."""
    from xdist.scheduler import LoadScopeScheduling

    workers = config.getoption("numprocesses") or 0  # a number by now ("auto" resolved)
    lane_wanted = config.getoption("waiting_lane") and workers > 1

    class ModuleUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        # the waiting lane's worker id, where there are several workers
        lane = lane_id(workers) if lane_wanted else None

        def _check_nodes_have_same_collection(self) -> bool:
            """The other workers collected the same tests (xdist's check, which takes the first
            collection as the run's: the lane's goes last), and the lane those of them that are in
            WAITING's modules, the only ones it imports."""
            lane = next((n for n in self.registered_collections if n.gateway.id == self.lane), None)
            if lane is None:
                return super()._check_nodes_have_same_collection()
            lanes = self.registered_collections.pop(lane)
            same = super()._check_nodes_have_same_collection()
            self.registered_collections[lane] = lanes
            run = next(iter(self.registered_collections.values()))
            if lanes == [nodeid for nodeid in run if unit_of(nodeid) in WAITING]:
                return same
            message = f"the waiting lane {lane.gateway.id} collected other tests of WAITING's modules than the rest"
            self.log(message)
            failed = pytest.CollectReport(nodeid=lane.gateway.id, outcome="failed", longrepr=message, result=[])
            self.config.hook.pytest_collectreport(report=failed)
            return False

        def _assign_work_unit(self, node) -> None:
            """The next unit in order that this worker takes; the lane, finding none, is done."""
            lane = node.gateway.id == self.lane
            scope = next((scope for scope in self.workqueue if (scope in WAITING) == lane), None)
            if scope is None and not lane:
                scope = next(iter(self.workqueue), None)  # a waiting unit the lane has not reached yet
            if scope is None:
                node.shutdown()
                return
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

    config.option.loadscopereorder = False
    return ModuleUnits(config, log)
