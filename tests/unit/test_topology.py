"""Topology-aware admission (api/dispatcher/placement.py, `admit_in_domain`): a gang with
`scaling.topology` is placed inside one value of a node label, the domain with the most room first;
`required` waits or can never fit, naming the domains it considered; `preferred` then goes across
domains. The job spec takes exactly one of the two (422 naming the field)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.dispatcher.placement import ClusterCapacity, Decision, Node, admit
from trainmaster.models import JobSpec, Scaling


def node(name: str, rack: str | None, cpus: float, free: float | None = None) -> Node:
    labels = {} if rack is None else {"rack": rack}
    return Node(name, {"CPU": cpus}, {"CPU": cpus if free is None else free}, labels=labels)


def racks(*nodes: Node) -> ClusterCapacity:
    return ClusterCapacity(list(nodes))


def gang(workers: int, **topology: str) -> Scaling:
    return Scaling.model_validate({"num_workers": workers, "topology": topology})


def test_a_required_gang_lands_inside_the_rack_with_room() -> None:
    cluster = racks(node("a1", "a", 1), node("a2", "a", 1, free=0), node("b1", "b", 1), node("b2", "b", 1))
    admission = admit(gang(2, required="rack"), cluster, {})
    assert admission.decision is Decision.admit
    assert set(admission.placement) == {"b1", "b2"} and admission.selector == {"rack": "b"}
    assert admission.reason.endswith("inside rack=b")

    with_driver = admit(gang(2, required="rack"), racks(node("a1", "a", 2), node("h", None, 1)), {"CPU": 1})
    assert with_driver.decision is Decision.admit and with_driver.selector == {"rack": "a"}
    assert sorted(len(bundles) for bundles in with_driver.placement.values()) == [1, 2]  # the driver anywhere


def test_a_required_gang_waits_or_can_never_fit_and_says_which_racks() -> None:
    cluster = racks(node("a1", "a", 1, free=0), node("a2", "a", 1), node("b1", "b", 1), node("b2", "b", 1, free=0))
    waiting = admit(gang(2, required="rack"), cluster, {})
    assert waiting.decision is Decision.wait  # two CPUs free in all, but not inside one rack
    assert waiting.reason.startswith(
        "waiting for room inside one rack: needs 2 CPU as 2 x {CPU: 1} PACK inside one rack"
    )
    assert "rack=a {CPU: 1}, rack=b {CPU: 1}" in waiting.reason

    never = admit(gang(3, required="rack"), cluster, {})
    assert never.decision is Decision.infeasible
    assert "can never fit inside one rack" in never.reason and "rack=a {CPU: 2}, rack=b {CPU: 2}" in never.reason
    unlabelled = admit(gang(1, required="zone"), cluster, {})
    assert unlabelled.decision is Decision.infeasible and "no node carries the label 'zone'" in unlabelled.reason


def test_a_preferred_gang_goes_across_racks_only_when_no_rack_has_room() -> None:
    roomy = racks(node("a1", "a", 2), node("b1", "b", 1), node("b2", "b", 1))
    inside = admit(gang(2, preferred="rack"), roomy, {})
    assert inside.selector == {"rack": "a"} and set(inside.placement) == {"a1"}

    split = racks(node("a1", "a", 1), node("b1", "b", 1))
    across = admit(gang(2, preferred="rack"), split, {})
    assert across.decision is Decision.admit and across.selector is None and set(across.placement) == {"a1", "b1"}
    assert "across racks (no single rack had room: rack=a {CPU: 1}, rack=b {CPU: 1})" in across.reason


def test_a_topology_names_exactly_one_label() -> None:
    base = {"name": "t", "entrypoint": "builtin:mlp"}
    for topology in ({}, {"required": "rack", "preferred": "block"}, {"required": ""}, {"nearby": "rack"}):
        with pytest.raises(ValidationError) as caught:
            JobSpec.model_validate({**base, "scaling": {"topology": topology}})
        assert caught.value.errors()[0]["loc"][:2] == ("scaling", "topology"), topology
    assert JobSpec.model_validate({**base, "scaling": {"topology": {"preferred": "rack"}}}).scaling.topology
