from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.model import Node
from gpupool.sim.cluster import (
    Cluster,
    cluster_from_machines,
    cluster_from_sizes,
    cluster_uniform,
    load_vc_sizes,
    scale_sizes,
)
from gpupool.sim.trace import TraceError


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_philly_vc_sizes_are_eleven_teams_of_352_nodes_in_file_order(traces_dir: Path) -> None:
    sizes = load_vc_sizes(traces_dir / "philly" / "vc_sizes.csv")
    assert len(sizes) == 11
    assert sum(sizes.values()) == 352
    assert next(iter(sizes.items())) == ("6214e9", 64)
    assert list(sizes)[-1] == "0e4a51"
    assert cluster_from_sizes(sizes, dedicated=True).gpus == 2816


def test_philly_scaled_by_a_fifth_is_seventy_nodes(traces_dir: Path) -> None:
    sizes = load_vc_sizes(traces_dir / "philly" / "vc_sizes.csv")
    scaled = scale_sizes(sizes, 0.2)
    assert sum(scaled.values()) == 70
    assert list(scaled) == list(sizes)


@pytest.mark.parametrize(
    ("count", "factor", "expected"),
    [
        (5, 0.5, 3),  # 2.5: banker's rounding would give 2
        (3, 0.5, 2),  # 1.5
        (15, 0.7, 11),  # 10.5 in decimal, 10.499999999999998 in floats
        (15, 0.1, 2),  # 1.5000000000000002
        (64, 0.2, 13),
        (8, 0.2, 2),
        (1, 0.1, 1),  # at least one node
        (4, 2.0, 8),
        (7, 1.0, 7),
    ],
)
def test_scaling_rounds_half_up_with_at_least_one_node(count: int, factor: float, expected: int) -> None:
    assert scale_sizes({"a": count}, factor) == {"a": expected}


@pytest.mark.parametrize("factor", [0.0, -0.5, math.nan, math.inf])
def test_scaling_needs_a_finite_positive_factor(factor: float) -> None:
    with pytest.raises(ValueError, match="scale factor"):
        scale_sizes({"a": 1}, factor)


def test_a_missing_vc_sizes_file_says_so(tmp_path: Path) -> None:
    path = tmp_path / "vc_sizes.csv"
    with pytest.raises(TraceError) as caught:
        load_vc_sizes(path)
    assert str(caught.value) == f"{path}: no such file"


def test_a_vc_sizes_file_without_the_node_column_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "vc_sizes.csv", "vc,nodes\na,1\n")
    with pytest.raises(TraceError) as caught:
        load_vc_sizes(path)
    assert str(caught.value) == f"{path}: missing column(s) node num"


@pytest.mark.parametrize(
    ("row", "column", "detail"),
    [
        (",4", "vc", "empty"),
        ("a,2", "vc", "vc 'a' already listed on line 2"),
        ("b,0", "node num", "'0' is not a positive integer"),
        ("b,-3", "node num", "'-3' is not a positive integer"),
        ("b,2.5", "node num", "'2.5' is not a positive integer"),
        ("b,x", "node num", "'x' is not a positive integer"),
        ("b,", "node num", "'' is not a positive integer"),
    ],
)
def test_a_bad_vc_sizes_row_is_reported_with_its_line_and_column(
    tmp_path: Path, row: str, column: str, detail: str
) -> None:
    path = write(tmp_path / "vc_sizes.csv", f"vc,node num\na,1\n{row}\n")
    with pytest.raises(TraceError) as caught:
        load_vc_sizes(path)
    assert str(caught.value) == f"{path} line 3, column {column}: {detail}"
    assert (caught.value.line, caught.value.column) == (3, column)


def test_a_vc_sizes_file_with_no_rows_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no vc rows"):
        load_vc_sizes(write(tmp_path / "vc_sizes.csv", "vc,node num\n"))


def test_dedicated_nodes_from_sizes_belong_to_their_team_in_file_order() -> None:
    cluster = cluster_from_sizes({"nlp": 2, "vision": 1}, 4, dedicated=True)
    assert cluster.nodes == (
        Node("nlp-000", 4, team="nlp"),
        Node("nlp-001", 4, team="nlp"),
        Node("vision-000", 4, team="vision"),
    )
    assert cluster.team_gpus == {"nlp": 8, "vision": 4}
    assert cluster.gpus == 12


def test_shared_nodes_from_sizes_belong_to_no_team_but_keep_the_guarantees() -> None:
    cluster = cluster_from_sizes({"nlp": 2, "vision": 1}, dedicated=False)
    assert all(node.team is None for node in cluster.nodes)
    assert [node.name for node in cluster.nodes] == ["nlp-000", "nlp-001", "vision-000"]
    assert cluster.team_gpus == {"nlp": 16, "vision": 8}
    assert cluster.gpus == 24


@pytest.mark.parametrize(
    ("sizes", "gpus_per_node", "message"),
    [
        ({"a": 0}, 8, "at least 1 node"),
        ({"": 1}, 8, "non-empty"),
        ({"a": 1}, 0, "gpus_per_node"),
    ],
)
def test_cluster_from_sizes_refuses_empty_teams_and_gpuless_nodes(
    sizes: dict[str, int], gpus_per_node: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        cluster_from_sizes(sizes, gpus_per_node, dedicated=True)


def test_uniform_nodes_are_split_by_weight_and_named_in_sequence() -> None:
    cluster = cluster_uniform(10, 8, {"b": 3.0, "a": 7.0}, dedicated=True)
    assert [node.name for node in cluster.nodes] == [f"node-{i:04d}" for i in range(10)]
    assert [node.team for node in cluster.nodes] == ["b"] * 3 + ["a"] * 7
    assert cluster.team_gpus == {"b": 24, "a": 56}
    assert list(cluster.team_gpus) == ["b", "a"]
    assert cluster.gpus == 80


def test_uniform_shared_nodes_belong_to_no_team_but_keep_each_share_as_guarantee() -> None:
    cluster = cluster_uniform(4, 2, {"a": 1.0, "b": 3.0}, dedicated=False)
    assert all(node.team is None for node in cluster.nodes)
    assert cluster.team_gpus == {"a": 2, "b": 6}


@pytest.mark.parametrize(
    ("nodes", "weights", "expected"),
    [
        (10, {"c": 1.0, "b": 1.0, "a": 1.0}, {"c": 3, "b": 3, "a": 4}),  # tie goes to the first name
        (3, {"a": 1.0, "b": 1.0, "c": 1.0}, {"a": 1, "b": 1, "c": 1}),
        (10, {"big": 99.0, "tiny": 1.0, "none": 0.0}, {"big": 8, "tiny": 1, "none": 1}),
        (100, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 97.0}, {"a": 1, "b": 1, "c": 1, "d": 97}),
        (6, {"x": 0.5, "z": 0.25, "y": 0.25}, {"x": 3, "z": 1, "y": 2}),  # y before z on the 0.5 tie
        (70, {"a": 256_112.0, "b": 164_931.0, "c": 13_558.0}, {"a": 41, "b": 27, "c": 2}),
    ],
)
def test_uniform_split_is_largest_remainder_with_at_least_one_node_each(
    nodes: int, weights: dict[str, float], expected: dict[str, int]
) -> None:
    cluster = cluster_uniform(nodes, 1, weights, dedicated=True)
    assert cluster.team_gpus == expected


@pytest.mark.parametrize(
    ("nodes", "weights", "message"),
    [
        (2, {"a": 1.0, "b": 1.0, "c": 1.0}, "cannot give each of the 3 teams at least one node"),
        (4, {}, "no teams"),
        (4, {"a": 0.0, "b": 0.0}, "all 0"),
        (4, {"a": -1.0}, "team 'a': weight"),
        (4, {"a": math.nan}, "team 'a': weight"),
        (4, {"a": math.inf}, "team 'a': weight"),
        (4, {"a": 1e308, "b": 1e308}, "overflow"),
    ],
)
def test_uniform_split_refuses_impossible_requests(nodes: int, weights: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cluster_uniform(nodes, 8, weights, dedicated=True)
    if nodes >= len(weights) or not weights:  # a shared pool splits its GPUs when nodes are too few
        with pytest.raises(ValueError, match=message):
            cluster_uniform(nodes, 8, weights, dedicated=False)


def test_a_shared_pool_with_fewer_nodes_than_teams_splits_its_gpus_as_guarantees() -> None:
    # A workstation of one 8-GPU node and three teams, as a lab's exported history has it.
    weights = {"nlp": 2.0, "vision": 5.0, "robotics": 1.0}
    cluster = cluster_uniform(1, 8, weights, dedicated=False)
    assert [(n.name, n.gpus, n.team) for n in cluster.nodes] == [("node-0000", 8, None)]
    assert cluster.team_gpus == {"nlp": 2, "vision": 5, "robotics": 1}
    machines = cluster_from_machines((("virtual", 8),), weights, dedicated=False)
    assert machines.team_gpus == cluster.team_gpus
    with pytest.raises(ValueError, match="2 GPU"):
        cluster_uniform(1, 2, weights, dedicated=False)


@given(
    weights=st.dictionaries(
        st.text(alphabet="abcdefgh", min_size=1, max_size=3),
        st.floats(min_value=0, max_value=1e9, allow_nan=False),
        min_size=1,
        max_size=12,
    ),
    extra=st.integers(min_value=0, max_value=500),
)
def test_uniform_split_hands_out_every_node_and_at_least_one_each(weights: dict[str, float], extra: int) -> None:
    if sum(weights.values()) <= 0:
        return
    nodes = len(weights) + extra
    cluster = cluster_uniform(nodes, 1, weights, dedicated=True)
    assert sum(cluster.team_gpus.values()) == nodes == len(cluster.nodes)
    assert all(count >= 1 for count in cluster.team_gpus.values())
    for team, count in cluster.team_gpus.items():
        assert sum(node.team == team for node in cluster.nodes) == count


def test_a_cluster_total_counts_every_node() -> None:
    cluster = Cluster(nodes=(Node("x", 2), Node("y", 6, team="t")), team_gpus={"t": 6})
    assert cluster.gpus == 8
