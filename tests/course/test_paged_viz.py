"""miniengine.course.paged_viz: snapshots of the paged pool agree with the block manager, and the pictures draw."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from miniengine.config import EngineConfig  # noqa: E402
from miniengine.course import paged_viz as pv  # noqa: E402
from miniengine.engine import LLMEngine  # noqa: E402
from miniengine.sampling import SamplingParams  # noqa: E402

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


def small_engine(model, kv_cache_tokens=40, block_size=4, **kw):
    return LLMEngine(EngineConfig(model=model, kv_cache_tokens=kv_cache_tokens, block_size=block_size, max_num_seqs=8,
                                  **kw))


def params(max_tokens, **kw):
    return SamplingParams(temperature=0.8, seed=3, max_tokens=max_tokens, ignore_eos=True, **kw)


TRACE = {0: [([5, 6, 7, 8, 9, 10], params(12), "A"), ([11, 12, 13, 14, 15, 16, 17, 18, 19], params(10), "B")],
         2: [([20, 21, 22, 23, 24], params(12, n=2), "C")],
         4: [([30, 31, 32, 33, 34, 35, 36], params(12), "D")]}


@pytest.fixture
def recorded(tiny_gqa):
    engine = small_engine(tiny_gqa)
    return engine, pv.record(engine, TRACE)


def test_seq_label_names_completions_of_a_forked_request(tiny_gqa):
    engine = small_engine(tiny_gqa, kv_cache_tokens=64)
    single = engine.add_request([1, 2, 3], params(4), request_id="x")
    forked = engine.add_request([1, 2, 3, 4, 5], params(4, n=3), request_id="y")
    assert pv.seq_label(single) == "x"
    assert pv.seq_label(forked) == "y.0"
    engine.step()
    assert [pv.seq_label(s) for s in forked.completions] == ["y.0", "y.1", "y.2"]


def test_slot_follows_the_block_table():
    view = pv.SeqView("s", (7, 2, 5), 10)
    assert [view.slot(p, 4) for p in range(12)] == [28, 29, 30, 31, 8, 9, 10, 11, 20, 21, 22, 23]
    with pytest.raises(IndexError):
        view.slot(12, 4)


def test_every_snapshot_agrees_with_the_reference_counts(recorded):
    engine, snaps = recorded
    assert snaps[0].step == 0 and not snaps[0].seqs
    assert [s.step for s in snaps] == list(range(len(snaps)))
    for snap in snaps:
        owners = snap.owners()
        for b in range(snap.num_blocks):
            assert snap.ref_count[b] == len(owners[b]), f"step {snap.step}, block {b}"
        assert snap.num_free == sum(1 for c in snap.ref_count if c == 0)
        assert snap.positions_used <= snap.blocks_held * snap.block_size
        for s in snap.seqs:  # a table covers exactly the positions written, rounded up to whole blocks
            assert len(s.table) == -(-s.cached // snap.block_size)
    last = snaps[-1]
    assert not last.seqs and not last.waiting and last.num_free == last.num_blocks
    assert last.preemptions == engine.scheduler.num_preemptions and last.copies == engine.kv.copies


def test_notes_name_what_happened(recorded):
    _, snaps = recorded
    notes = " | ".join(s.note for s in snaps)
    assert "prefilled: A, B" in snaps[1].note
    assert "forked (sharing every block): C.1" in notes
    copied = [s for a, s in zip(snaps, snaps[1:]) if s.copies > a.copies]
    assert copied and all("copy-on-write" in s.note for s in copied)
    preempted = [s for a, s in zip(snaps, snaps[1:]) if s.preemptions > a.preemptions]
    assert preempted, "the trace is meant to run out of blocks"
    assert all("preempted" in s.note for s in preempted)
    assert "finished" in notes


def test_the_fork_shares_blocks_until_it_writes(recorded):
    _, snaps = recorded
    forked = next(s for s in snaps if any(v.label == "C.1" for v in s.seqs))
    tables = {v.label: v.table for v in forked.seqs}
    assert tables["C.0"] == tables["C.1"]
    assert all(forked.ref_count[b] == 2 for b in tables["C.0"])


def test_record_stops_a_run_that_does_not_end(tiny_gqa):
    engine = small_engine(tiny_gqa)
    with pytest.raises(RuntimeError, match="still had work"):
        pv.record(engine, {0: [([1, 2, 3], params(20), "A")]}, max_steps=3)
    snaps = pv.record(small_engine(tiny_gqa), {0: [([1, 2, 3], params(3), "A")]}, max_steps=3)  # just enough
    assert len(snaps) == 4 and "finished: A" in snaps[-1].note


def test_arrivals_join_after_their_step(tiny_gqa):
    snaps = pv.record(small_engine(tiny_gqa), {0: [([1, 2, 3], params(2), "A")], 4: [([4, 5], params(1), "B")]})
    assert [s.note for s in snaps[1:]] == ["prefilled: A", "finished: A", "idle", "idle", "prefilled: B; finished: B"]


def test_the_pictures_draw(recorded, tiny_gqa):
    _, snaps = recorded
    colors = pv.palette(snaps)
    assert set(colors) >= {"A", "B", "C.0", "C.1", "D"}
    busiest = max(snaps, key=lambda s: s.blocks_held)
    fig = pv.render(busiest, colors)
    assert len(fig.axes) == 2
    plt.close(fig)
    contiguous = small_engine(tiny_gqa, kv_layout="contiguous", kv_cache_tokens=60)
    seqs = [contiguous.add_request([1, 2, 3, 4], params(8), request_id=r) for r in "xy"]
    contiguous.step()
    spans = pv.arena_spans(seqs)
    assert spans == [("x", 0, 4, 12), ("y", 12, 4, 12)]
    assert pv.free_runs(60, spans) == [(24, 36)]
    assert pv.free_runs(60, [("a", 10, 1, 5), ("b", 30, 2, 30)]) == [(0, 10), (15, 15)]
    fig, ax = plt.subplots()
    pv.draw_arena(ax, 60, spans)
    plt.close(fig)


def test_the_explorer_is_built_on_interactive_output(recorded):
    widgets = pytest.importorskip("ipywidgets")
    _, snaps = recorded
    box = pv.pool_explorer(snaps)
    slider, out = box.children
    assert isinstance(slider, widgets.IntSlider) and slider.max == len(snaps) - 1
    assert isinstance(out, widgets.Output)
    plt.close("all")
