"""SlotAllocator and ReqToSlotTable: exact ids, FIFO reuse, no partial allocation."""

from __future__ import annotations

import pytest
import torch

from radixserve.cache import ReqToSlotTable, SlotAllocator


def ids(t: torch.Tensor | None) -> list[int]:
    assert t is not None
    return t.tolist()


def test_fresh_allocator_hands_out_ids_in_order() -> None:
    a = SlotAllocator(8)
    first = a.alloc(3)
    assert first is not None and first.dtype == torch.int64 and first.dim() == 1
    assert ids(first) == [0, 1, 2]
    assert ids(a.alloc(2)) == [3, 4]
    assert a.num_free == 3 and a.num_used == 5 and a.num_slots == 8


def test_alloc_zero_is_empty_and_negative_is_an_error() -> None:
    a = SlotAllocator(4)
    assert ids(a.alloc(0)) == []
    assert a.num_free == 4
    with pytest.raises(ValueError):
        a.alloc(-1)


def test_alloc_never_partial() -> None:
    a = SlotAllocator(4)
    assert ids(a.alloc(3)) == [0, 1, 2]
    assert a.alloc(2) is None
    assert a.num_free == 1
    assert ids(a.free_slots()) == [3]
    assert ids(a.alloc(1)) == [3]
    assert a.alloc(1) is None


def test_freed_slots_are_reused_after_older_free_slots() -> None:
    a = SlotAllocator(8)
    got = a.alloc(4)
    assert got is not None
    a.free(torch.tensor([2, 0]))
    assert ids(a.free_slots()) == [4, 5, 6, 7, 2, 0]
    assert ids(a.alloc(5)) == [4, 5, 6, 7, 2]
    assert ids(a.free_slots()) == [0]


def test_ring_wraps_around_on_alloc_and_free() -> None:
    a = SlotAllocator(5)
    assert ids(a.alloc(4)) == [0, 1, 2, 3]
    # tail is at ring index 0 after 1 free slot at index 4: these frees wrap
    a.free(torch.tensor([3, 1, 0], dtype=torch.int32))
    assert ids(a.free_slots()) == [4, 3, 1, 0]
    assert ids(a.alloc(4)) == [4, 3, 1, 0]  # crosses the end of the ring
    a.free(torch.tensor([[0, 4], [3, 1]]))  # any shape
    assert ids(a.free_slots()) == [0, 4, 3, 1]
    assert a.num_free == 4


def test_freeing_more_than_exists_is_caught() -> None:
    a = SlotAllocator(3)
    got = a.alloc(1)
    assert got is not None
    a.free(got)
    with pytest.raises(RuntimeError, match="double free"):
        a.free(got)


@pytest.mark.parametrize(
    ("bad", "match"),
    [([1], "double free"), ([2, 2], "twice"), ([7], "outside"), ([-1], "outside")],
)
def test_debug_mode_validates_frees(bad: list[int], match: str) -> None:
    a = SlotAllocator(5, debug=True)
    got = a.alloc(4)
    assert got is not None
    a.free(got[:2])  # slots 0, 1 free again; 2, 3 still in use
    with pytest.raises(RuntimeError, match=match):
        a.free(torch.tensor(bad))
    a.free(torch.tensor([2, 3]))  # the legitimate free still works
    assert a.num_free == 5


def test_reset_restores_id_order() -> None:
    a = SlotAllocator(4)
    a.alloc(3)
    a.free(torch.tensor([1]))
    a.reset()
    assert a.num_free == 4
    assert ids(a.free_slots()) == [0, 1, 2, 3]


def test_req_table_rows_and_slots() -> None:
    t = ReqToSlotTable(max_requests=2, max_context=8)
    assert t.table.dtype == torch.int32 and t.table.shape == (2, 8)
    r0, r1 = t.alloc_row(), t.alloc_row()
    assert (r0, r1) == (0, 1)
    assert t.alloc_row() is None
    assert r0 is not None and r1 is not None
    t.write(r0, 0, torch.tensor([7, 3, 5]))
    t.write(r0, 3, torch.tensor([9], dtype=torch.int32))
    out = t.read(r0, 4)
    assert out.dtype == torch.int64 and ids(out) == [7, 3, 5, 9]
    t.write(r1, 0, torch.tensor([1]))
    assert ids(t.read(r0, 4)) == [7, 3, 5, 9]  # rows are independent
    out[0] = 100  # read returns a copy
    assert ids(t.read(r0, 1)) == [7]
    t.free_row(r0)
    assert t.num_free_rows == 1 and t.alloc_row() == 0


def test_req_table_rejects_bad_rows_and_ranges() -> None:
    t = ReqToSlotTable(max_requests=2, max_context=4)
    row = t.alloc_row()
    assert row == 0
    with pytest.raises(ValueError):
        t.write(row, 2, torch.tensor([1, 2, 3]))  # past max_context
    with pytest.raises(ValueError):
        t.read(row, 5)
    with pytest.raises(ValueError):
        t.write(1, 0, torch.tensor([1]))  # row 1 not allocated
    t.free_row(row)
    with pytest.raises(ValueError):
        t.free_row(row)  # double free
    with pytest.raises(ValueError):
        t.free_row(5)
