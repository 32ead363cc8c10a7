"""Tests of workflow definitions, validation and TOML files (workloads/workflows.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from cosched.errors import ConfigError, SchedulingError
from workloads.workflows import (
    APPS,
    Stage,
    Workflow,
    load_workflow,
    paper_mix,
    paper_workflows,
    workflow_to_toml,
)


def _wf(*stages: Stage, cores: int = 8, name: str = "w") -> Workflow:
    return Workflow(name, "blast", cores, 1024, stages)


def _chain() -> Workflow:
    return _wf(
        Stage("a", "blast.split", False),
        Stage("b", "blast.blastn", True, 4, ("a",)),
        Stage("c", "blast.blastn", True, 4, ("a",)),
        Stage("d", "blast.merge", False, 1, ("b", "c")),
    )


# -- The paper's workflows ------------------------------------------------------------


@pytest.mark.parametrize("cores", [8, 16, 32, 64])
def test_paper_workflows_are_valid_and_named(cores: int) -> None:
    workflows = paper_workflows(cores)
    assert set(workflows) == set(APPS)
    for app, wf in workflows.items():
        assert wf.app == app
        assert wf.cores == cores
        assert wf.name == f"{app}-{cores}"
        assert all(stage.app_class.startswith(f"{app}.") for stage in wf.stages)


def test_paper_stage_structures_follow_section_4_2() -> None:
    wfs = paper_workflows(16)
    montage = wfs["montage"].stages
    assert len(montage) == 9
    assert sum(s.parallel for s in montage) == 5
    assert [s.parallel for s in wfs["blast"].stages] == [False, True, False]
    assert [s.parallel for s in wfs["statistics"].stages] == [False, True, False, True]
    assert [(s.name, s.parallel) for s in wfs["synthetic"].stages] == [("fill", False), ("compute", True)]


def test_paper_mix_is_45_submissions_with_the_section_4_4_core_counts() -> None:
    mix = paper_mix()
    assert len(mix) == 45
    assert len({wf.name for wf in mix}) == 45
    per_app = Counter((wf.app, wf.cores) for wf in mix)
    for app in ("montage", "blast", "statistics"):
        assert {cores: per_app[(app, cores)] for cores in (8, 16, 32, 64)} == {8: 3, 16: 3, 32: 3, 64: 3}
    assert {c: n for (app, c), n in per_app.items() if app == "synthetic"} == {16: 3, 32: 3, 64: 3}
    assert sum(wf.cores for wf in paper_mix(1)) == 3 * 120 + 112  # 472 cores per repetition
    assert len(paper_mix(2)) == 30


@pytest.mark.parametrize("repeats", [0, -1, 1.5, True])
def test_paper_mix_rejects_bad_repeats(repeats: object) -> None:
    with pytest.raises(ConfigError, match="repeats"):
        paper_mix(repeats)  # type: ignore[arg-type]


# -- Order and readiness --------------------------------------------------------------


@pytest.mark.parametrize("app", APPS)
def test_topological_order_respects_depends(app: str) -> None:
    wf = paper_workflows(32)[app]
    order = [s.name for s in wf.topological_order()]
    assert sorted(order) == sorted(s.name for s in wf.stages)
    position = {name: i for i, name in enumerate(order)}
    for stage in wf.stages:
        for dep in stage.depends:
            assert position[dep] < position[stage.name], (stage.name, dep)


def test_topological_order_of_a_declared_out_of_order_workflow() -> None:
    wf = _wf(Stage("late", "x", False, 1, ("early",)), Stage("early", "x", False))
    assert [s.name for s in wf.topological_order()] == ["early", "late"]


def _rounds(stages: list[Stage]) -> list[str] | None:
    """The order by definition: each round, every stage whose dependencies all came before, in
    declaration order; None when a round finds none (a cycle)."""
    order: list[str] = []
    while len(order) < len(stages):
        batch = [s.name for s in stages if s.name not in order and set(s.depends) <= set(order)]
        if not batch:
            return None
        order += batch
    return order


@given(st.lists(st.lists(st.integers(0, 11), max_size=4), min_size=1, max_size=12))
@example([[], [], [1], [0]])  # s3's dependency comes first, s2 is declared first
def test_the_order_is_taken_round_by_round_in_declaration_order(edges: list[list[int]]) -> None:
    """Any graph, cycles included: the order, found in time linear in the stages and dependencies
    (`benchmarks/workflow_order.py` times it against scanning every stage each round), is the
    rounds' order, and a cycle is refused."""
    stages = [
        Stage(f"s{i}", "x", False, 1, tuple(f"s{d % len(edges)}" for d in depends)) for i, depends in enumerate(edges)
    ]
    expected = _rounds(stages)
    if expected is None:
        with pytest.raises(ConfigError, match="dependency cycle"):
            _wf(*stages)
    else:
        assert [s.name for s in _wf(*stages).topological_order()] == expected


def test_ready_progression_through_a_diamond() -> None:
    wf = _chain()
    assert [s.name for s in wf.ready(set())] == ["a"]
    assert [s.name for s in wf.ready({"a"})] == ["b", "c"]
    assert [s.name for s in wf.ready({"a", "b"})] == ["c"]
    assert [s.name for s in wf.ready({"a", "b", "c"})] == ["d"]
    assert wf.ready({"a", "b", "c", "d"}) == []


def test_release_skips_submitted_stages_and_stops_after_a_failure() -> None:
    wf = _chain()
    assert [s.name for s in wf.to_release({"a"}, {"a", "b"}, failed=False)] == ["c"]
    assert wf.to_release({"a"}, {"a"}, failed=True) == []
    assert wf.to_release({"a", "b", "c", "d"}, {"a", "b", "c", "d"}, failed=False) == []


def test_ready_runs_montage_overlaps_beside_project() -> None:
    montage = paper_workflows(8)["montage"]
    assert {s.name for s in montage.ready({"imgtbl"})} == {"project", "overlaps"}
    assert [s.name for s in montage.ready({"imgtbl", "project"})] == ["overlaps"]


def test_ready_rejects_unknown_stage_names() -> None:
    with pytest.raises(SchedulingError, match="nope"):
        _chain().ready({"a", "nope"})


def test_stage_lookup() -> None:
    assert _chain().stage("d").depends == ("b", "c")
    with pytest.raises(SchedulingError):
        _chain().stage("zz")


def test_stage_depends_given_as_list_is_stored_as_tuple() -> None:
    stage = Stage("s", "x", True, 2, ["a"])  # type: ignore[arg-type]
    assert stage.depends == ("a",)
    hash(stage)


# -- Validation --------------------------------------------------------------------------


def test_cycle_is_named() -> None:
    with pytest.raises(ConfigError, match=r"workflow 'w'.*cycle b -> c -> b") as info:
        _wf(
            Stage("a", "x", False),
            Stage("b", "x", False, 1, ("a", "c")),
            Stage("c", "x", False, 1, ("b",)),
        )
    assert "\n" not in str(info.value)


def test_self_dependency_is_a_cycle() -> None:
    with pytest.raises(ConfigError, match=r"cycle a -> a"):
        _wf(Stage("a", "x", False, 1, ("a",)))


def test_unknown_dependency() -> None:
    with pytest.raises(ConfigError, match=r"workflow 'w': stage 'b': depends on unknown stage 'zz'"):
        _wf(Stage("a", "x", False), Stage("b", "x", False, 1, ("zz",)))


def test_duplicate_stage_names() -> None:
    with pytest.raises(ConfigError, match=r"workflow 'w': stages: duplicate stage name 'a'"):
        _wf(Stage("a", "x", False), Stage("a", "y", True))


@pytest.mark.parametrize("cores", [0, -8, 2.5, True])
def test_bad_cores(cores: object) -> None:
    with pytest.raises(ConfigError, match=r"workflow 'w': cores"):
        _wf(Stage("a", "x", False), cores=cores)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"app": ""}, "app"),
        ({"memory_per_core": -1}, "memory_per_core"),
        ({"stages": ()}, "stages"),
    ],
)
def test_bad_workflow_fields(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=rf"workflow 'blast-8': {field}"):
        replace(paper_workflows(8)["blast"], **change)


def test_bad_tasks_names_the_stage() -> None:
    with pytest.raises(ConfigError, match=r"stage 'a': tasks"):
        _wf(Stage("a", "x", False, 0))


def test_replace_revalidates() -> None:
    blast = paper_workflows(8)["blast"]
    assert replace(blast, cores=16).cores == 16
    with pytest.raises(ConfigError, match="cores"):
        replace(blast, cores=0)


# -- TOML ----------------------------------------------------------------------------------


@pytest.mark.parametrize("app", APPS)
def test_toml_round_trip(tmp_path: Path, app: str) -> None:
    wf = paper_workflows(32)[app]
    path = tmp_path / f"{app}.toml"
    path.write_text(workflow_to_toml(wf), encoding="utf-8")
    assert load_workflow(path) == wf


def test_load_hand_written_file(tmp_path: Path) -> None:
    path = tmp_path / "wf.toml"
    path.write_text(
        """
[workflow]
name = "mine"
app = "statistics"
cores = 4

[[stage]]
name = "load"
app_class = "statistics.read"
parallel = false

[[stage]]
name = "crunch"
app_class = "statistics.moments"
parallel = true
tasks = 12
depends = ["load"]
""",
        encoding="utf-8",
    )
    wf = load_workflow(path)
    assert wf.memory_per_core == 0
    assert wf.stages[0] == Stage("load", "statistics.read", False, 1, ())
    assert wf.stages[1] == Stage("crunch", "statistics.moments", True, 12, ("load",))


_GOOD_HEAD = '[workflow]\nname = "w"\napp = "blast"\ncores = 8\n'
_GOOD_STAGE = '[[stage]]\nname = "a"\napp_class = "blast.split"\nparallel = false\n'


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not toml = = 1", "not valid TOML"),
        (_GOOD_STAGE, r"missing the \[workflow\] table"),
        ('[workflow]\nname = "w"\napp = "blast"\n' + _GOOD_STAGE, "missing 'cores'"),
        (_GOOD_HEAD + "nodes = 2\n" + _GOOD_STAGE, "unknown key 'nodes'"),
        (_GOOD_HEAD.replace("cores = 8", 'cores = "8"') + _GOOD_STAGE, "cores must be int"),
        (_GOOD_HEAD.replace("cores = 8", "cores = 0") + _GOOD_STAGE, "workflow 'w': cores"),
        (_GOOD_HEAD + _GOOD_STAGE.replace("parallel = false", 'parallel = "no"'), "stage 'a': parallel"),
        (_GOOD_HEAD + _GOOD_STAGE.replace("parallel = false\n", ""), "stage 'a' is missing 'parallel'"),
        (_GOOD_HEAD + _GOOD_STAGE + "depends = [1]\n", "depends must be a list of stage names"),
        (_GOOD_HEAD + _GOOD_STAGE + 'depends = ["a"]\n', "cycle a -> a"),
        (_GOOD_HEAD, "at least one stage"),
        (_GOOD_HEAD + "[extra]\n" + _GOOD_STAGE, "unknown top-level"),
    ],
)
def test_load_errors_are_one_line_naming_the_file(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=problem) as info:
        load_workflow(path)
    message = str(info.value)
    assert message.startswith(str(path))
    assert "\n" not in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read workflow file"):
        load_workflow(tmp_path / "absent.toml")


def test_a_stage_the_core_refuses_fails_its_workflow_in_replay() -> None:
    """A stage whose memory no node holds is refused by the core: in replay its workflow was left
    neither finished nor failed, with no word (an audit of the two worlds). It now fails as the
    daemon's does: the stage named, the ones after it never submitted."""
    from cosched.model import Cluster, JobState
    from cosched.replay.driver import PolicySet, replay
    from cosched.replay.workflow_runs import WorkflowRuns

    runs = WorkflowRuns(lambda workflow, stage: (100.0, 50.0))
    stages = (Stage("a", "custom.a", True, 1, ()), Stage("b", "custom.b", True, 1, ("a",)))
    jobs = runs.submit(Workflow("w", "custom", 2, 3000, stages), 0.0)
    result = replay(jobs, Cluster(2, 4, memory_per_node=4096), PolicySet(), react=runs.react)
    [run] = runs.runs.values()
    assert [job.state for job in result.rejected] == [JobState.FAILED]
    assert (run.finished, run.failed_stage, list(run.jobs)) == (True, "a", ["a"])
