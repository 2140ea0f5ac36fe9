"""Partition names and permissions (shared/core/wire/subjects.py, shared/auth/roles.py; docs/architecture.md,
"Executor partitions")."""

from __future__ import annotations

from reel.shared.auth.roles import client_may_publish, grants, may_publish
from reel.shared.core.wire.subjects import Names, partition_of


def test_partition_of_is_the_servers_fnv1a_mapping() -> None:
    # what nats-server 2.15's {{partition(4,1)}} stored these run ids under (measured on a real server)
    assert [partition_of(r, 4) for r in ("r-abc", "r-1", "xyz123", "0" * 20)] == [0, 3, 0, 1]


def test_keyed_subjects_round_trip_and_others_are_not_keyed() -> None:
    n = Names("reel", 4)
    assert n.run_command("r-1", "start") == "reel.cmd.run.r-1.start"
    assert n.keyed_command("reel.cmd.part.3.r-1.resume") == (3, "r-1", "resume")
    for other in ("reel.cmd.start", "reel.cmd.part.x.r-1.start", "reel.cmd.part.3.r-1.cancel",
                  "acme.cmd.part.3.r-1.start", "reel.cmd.part.3.r-1.start.more"):
        assert n.keyed_command(other) is None, other
    src, dest = n.partition_transform()
    assert (src, dest) == ("reel.cmd.run.*.*", "reel.cmd.part.{{partition(4,1)}}.{{wildcard(1)}}.{{wildcard(2)}}")


def test_partition_permissions_only_with_partitions() -> None:
    off, on = grants(Names("reel")), grants(Names("reel", 2))
    nxt = "$JS.API.CONSUMER.MSG.NEXT.REEL_CMDS.reel_executor_p1"
    assert may_publish(on["executor"], nxt) and not may_publish(off["executor"], nxt)
    assert not may_publish(on["executor"], "$JS.API.CONSUMER.MSG.NEXT.REEL_CMDS.reel_executor_p2")
    assert may_publish(on["mutators"], "reel.cmd.run.r-1.resume")
    assert not may_publish(off["mutators"], "reel.cmd.run.r-1.resume")
    assert client_may_publish(Names("reel", 2), "reel.cmd.run.r-1.start")
    assert not client_may_publish(Names("reel", 2), "reel.cmd.run.r-1.resume")
    assert not client_may_publish(Names("reel"), "reel.cmd.run.r-1.start")
