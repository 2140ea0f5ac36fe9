"""FrozenMap: an immutable, insertion-ordered mapping whose versions share structure (shared/core/run/persistent.py)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reel.shared.core.run.persistent import CHUNK, FrozenMap, MapBuilder, enc_hook, from_builtins


def test_reads_like_a_dict_in_insertion_order() -> None:
    m = FrozenMap.of([("b", 1), ("a", 2), ("c", 3)])
    assert list(m) == ["b", "a", "c"] and list(m.items()) == [("b", 1), ("a", 2), ("c", 3)]
    assert m["a"] == 2 and m.get("z") is None and m.get("z", 9) == 9 and "c" in m and "z" not in m
    assert len(m) == 3 and m.to_dict() == {"b": 1, "a": 2, "c": 3}
    assert m == {"a": 2, "b": 1, "c": 3} and m == FrozenMap.of({"c": 3, "a": 2, "b": 1})  # dict equality
    assert m != {"a": 2} and m != FrozenMap.of({"a": 2})
    with pytest.raises(KeyError):
        m["z"]


def test_nothing_changes_a_map() -> None:
    m = FrozenMap.of({"a": 1})
    with pytest.raises(TypeError):
        m["a"] = 2  # type: ignore[index]
    m2 = m.set("a", 5).set("b", 6)
    assert m.to_dict() == {"a": 1} and m2.to_dict() == {"a": 5, "b": 6}
    builder = MapBuilder(m2)
    builder["c"] = 7
    builder["a"] = 8
    m3 = builder.finish()
    assert m2.to_dict() == {"a": 5, "b": 6} and m3.to_dict() == {"a": 8, "b": 6, "c": 7}
    assert not FrozenMap() and list(FrozenMap.of({"x": 1})) == ["x"] and not FrozenMap()  # the empty map stays empty


@pytest.mark.parametrize("n", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK])
def test_two_futures_of_one_map_never_see_each_others_keys(n: int) -> None:
    """Appending to a map whose key log a sibling already extended forks the log (at any chunk boundary)."""
    base = FrozenMap.of((f"k{i}", i) for i in range(n))
    left = base.set("left", -1).set("left2", -2)
    right = base.set("right", -3)
    builder = MapBuilder(base)
    builder["built"] = -4
    built = builder.finish()
    keys = [f"k{i}" for i in range(n)]
    assert list(base) == keys
    assert list(left) == [*keys, "left", "left2"] and list(right) == [*keys, "right"]
    assert list(built) == [*keys, "built"]
    assert list(left.set("left3", 0)) == [*keys, "left", "left2", "left3"] and list(right) == [*keys, "right"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from("abcdefgh"), st.integers()), max_size=60))
def test_any_history_of_versions_matches_copied_dicts(ops: list[tuple[int, str, int]]) -> None:
    """Versions grown from any earlier version behave exactly like independent dict copies."""
    maps: list[FrozenMap[str, int]] = [FrozenMap()]
    dicts: list[dict[str, int]] = [{}]
    for pick, key, value in ops:
        i = pick % len(maps)
        maps.append(maps[i].set(key, value))
        dicts.append({**dicts[i], key: value})
    for m, d in zip(maps, dicts, strict=True):
        assert list(m.items()) == list(d.items())


def test_encodes_as_the_dict_it_reads_as_and_decodes_back() -> None:
    class Holder(msgspec.Struct):
        m: FrozenMap[str, int]

    def dec_hook(kind: object, obj: object) -> object:
        assert isinstance(obj, dict)
        return from_builtins(obj)

    m = FrozenMap.of({"z": 1, "a": 2})
    data = msgspec.json.encode(Holder(m=m), enc_hook=enc_hook)
    assert data == msgspec.json.encode({"m": {"z": 1, "a": 2}})
    back = msgspec.json.decode(data, type=Holder, dec_hook=dec_hook).m
    assert list(back.items()) == [("z", 1), ("a", 2)] and list(back.set("b", 3)) == ["z", "a", "b"]
    with pytest.raises(TypeError):
        msgspec.json.encode(Holder(m=m))  # without the hook msgspec refuses (no silent dict copy)
