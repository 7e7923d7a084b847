"""Pictures of KV memory for lecture 05: the contiguous arena, the paged pool with its block tables, and an
explorer that steps through a recorded run.

The computation is kept apart from the drawing, as in :mod:`miniengine.course.widgets`: :func:`snapshot` reads the
state of a paged engine (who holds which block, how full each block is, the reference counts) into a plain,
immutable :class:`PoolSnapshot`; :func:`record` steps an engine through a small trace and keeps one snapshot
per step.  The drawing functions take snapshots, so a notebook run by papermill, where nobody moves a slider,
draws exactly what the explorer would.  ipywidgets is imported only when the explorer is built.
"""
from __future__ import annotations

import dataclasses

import numpy as np

FREE_COLOR = "#f2f2f2"


def seq_label(seq) -> str:
    """A sequence's name in the pictures: its request id, with ``.i`` for completion i of an ``n > 1`` request."""
    return f"{seq.request_id}.{seq.child_index}" if seq.root.params.n > 1 else str(seq.request_id)


@dataclasses.dataclass(frozen=True)
class SeqView:
    """One running sequence as the block manager sees it."""

    label: str
    table: tuple[int, ...]  # its block table: the pool's blocks that hold its positions, in order
    cached: int  # positions whose K/V are stored (the table covers them, rounded up to whole blocks)

    def slot(self, position: int, block_size: int) -> int:
        """Where position p of this sequence lives in the pool: table[p // block_size] * block_size + p % block_size."""
        if not 0 <= position < len(self.table) * block_size:
            raise IndexError(f"position {position} is outside the {len(self.table)} blocks of {self.label}'s table")
        return self.table[position // block_size] * block_size + position % block_size


@dataclasses.dataclass(frozen=True)
class PoolSnapshot:
    """The paged pool after one engine step: every block's holders, fill and reference count."""

    step: int
    num_blocks: int
    block_size: int
    seqs: tuple[SeqView, ...]  # running sequences, in the scheduler's order
    waiting: tuple[str, ...]  # labels of the waiting sequences (preempted ones come first)
    ref_count: tuple[int, ...]
    num_free: int
    preemptions: int  # so far, in the whole run
    copies: int  # copy-on-write block copies so far
    note: str = ""

    def owners(self) -> list[list[str]]:
        """For each block, the labels of the sequences whose tables hold it (several when it is shared)."""
        held = [[] for _ in range(self.num_blocks)]
        for s in self.seqs:
            for b in s.table:
                held[b].append(s.label)
        return held

    def fill(self) -> np.ndarray:
        """Positions of each block that hold K/V (the largest over its holders; 0 for a free block)."""
        used = np.zeros(self.num_blocks, dtype=int)
        for s in self.seqs:
            for i, b in enumerate(s.table):
                used[b] = max(used[b], min(self.block_size, s.cached - i * self.block_size))
        return used

    @property
    def blocks_held(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def positions_used(self) -> int:
        """Distinct positions holding K/V: a shared block counts once."""
        return int(self.fill().sum())

    def table_text(self) -> str:
        """The block tables, one line per running sequence."""
        if not self.seqs:
            return "(no sequence is running)"
        width = max(len(s.label) for s in self.seqs)
        return "\n".join(f"{s.label:>{width}}: {list(s.table)}  ({s.cached} positions)" for s in self.seqs)


def snapshot(engine, step: int = 0, note: str = "") -> PoolSnapshot:
    """The state of ``engine`` (an LLMEngine whose KV layout is a PagedKV) as a :class:`PoolSnapshot`."""
    kv = engine.kv
    bm = kv.block_manager
    seqs = tuple(SeqView(seq_label(s), tuple(bm.block_tables[s.seq_id]), s.num_cached_tokens)
                 for s in engine.scheduler.running if s.seq_id in bm.block_tables)
    return PoolSnapshot(step, bm.num_blocks, bm.block_size, seqs, tuple(seq_label(s) for s in engine.scheduler.waiting),
                        tuple(bm.ref_count), bm.num_free_blocks, engine.scheduler.num_preemptions, kv.copies, note)


def record(engine, arrivals: dict, max_steps: int = 1000) -> list[PoolSnapshot]:
    """Step ``engine`` until it is idle; return the pool before the first step and after every step.

    ``arrivals`` maps a number of steps k to the requests that arrive after step k (before step k + 1; k = 0
    is the start), each a tuple ``(prompt_token_ids, SamplingParams, request_id)``.  Each snapshot's ``note``
    says what happened in that step: who was prefilled (again, after a preemption), who was forked, who was
    preempted, who finished, and how many blocks were copied on write.
    """
    pending = dict(sorted(arrivals.items()))
    snaps = [snapshot(engine, 0, "before the first step")]
    for step in range(1, max_steps + 1):
        for prompt, params, rid in pending.pop(step - 1, []):
            engine.add_request(prompt, params, request_id=rid)
        if not engine.has_unfinished_requests():
            if not pending:
                break
            snaps.append(snapshot(engine, step, "idle"))
            continue
        before = snaps[-1]
        running_before = {s.label for s in before.seqs}
        got = engine.step()
        snap = snapshot(engine, step)
        events = []
        finished = [s for s in got if s.is_finished]
        new = [s for s in list(engine.scheduler.running) + finished if seq_label(s) not in running_before]
        joined = [seq_label(s) for s in new if s.parent is None]
        forked = [seq_label(s) for s in new if s.parent is not None]
        if joined:
            events.append("prefilled: " + ", ".join(joined))
        if forked:
            events.append("forked (sharing every block): " + ", ".join(forked))
        if snap.preemptions > before.preemptions:
            events.append("preempted: " + ", ".join(label for label in snap.waiting if label in running_before))
        if finished:
            events.append("finished: " + ", ".join(seq_label(s) for s in finished))
        if snap.copies > before.copies:
            events.append(f"copy-on-write: {snap.copies - before.copies} block(s) copied")
        snaps.append(dataclasses.replace(snap, note="; ".join(events) or "every running sequence decoded one token"))
    if engine.has_unfinished_requests() or pending:
        raise RuntimeError(f"the engine still had work after {max_steps} steps")
    return snaps


def palette(snaps) -> dict[str, tuple]:
    """A fixed colour per sequence label, in order of first appearance over all the snapshots."""
    import matplotlib.pyplot as plt

    labels = []
    for snap in snaps:
        for label in [s.label for s in snap.seqs] + list(snap.waiting):
            if label not in labels:
                labels.append(label)
    cmap = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    return {label: cmap(i % cmap.N) for i, label in enumerate(labels)}


def draw_pool(snap: PoolSnapshot, ax, colors: dict | None = None, columns: int | None = None):
    """The pool as a grid of blocks: each block coloured by its holder, filled as far as it holds K/V.

    A free block is pale grey; a shared block is split into stripes, one per holder, and shows its
    reference count.  Returns ``ax``.
    """
    import matplotlib.patches as mpatches

    colors = colors if colors is not None else palette([snap])
    columns = columns or min(snap.num_blocks, 16)
    rows = -(-snap.num_blocks // columns)
    pitch = 1.3  # rows of blocks, with room for the block numbers under them
    owners, fill = snap.owners(), snap.fill()
    for b in range(snap.num_blocks):
        x, y = b % columns, pitch * (b // columns)
        ax.add_patch(mpatches.Rectangle((x + 0.05, y + 0.05), 0.9, 0.9, facecolor=FREE_COLOR, edgecolor="#999", lw=0.8))
        holders = owners[b]
        if holders:
            height = 0.9 * fill[b] / snap.block_size
            width = 0.9 / len(holders)
            for j, label in enumerate(holders):
                ax.add_patch(mpatches.Rectangle((x + 0.05 + j * width, y + 0.95 - height), width, height,
                                                facecolor=colors.get(label, "k"), edgecolor="none"))
            ax.add_patch(mpatches.Rectangle((x + 0.05, y + 0.05), 0.9, 0.9, facecolor="none", edgecolor="k", lw=1.2))
            text = holders[0] if len(holders) == 1 else f"x{snap.ref_count[b]}"
            ax.text(x + 0.5, y + 0.32, text, ha="center", va="center", fontsize=7,
                    bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})
        ax.text(x + 0.5, y + 1.0, str(b), ha="center", va="top", fontsize=6, color="#555")
    ax.set_xlim(0, columns)
    ax.set_ylim(pitch * rows, 0)
    ax.set_aspect("equal")
    ax.axis("off")
    return ax


def draw_tables(snap: PoolSnapshot, ax, colors: dict | None = None, width: int | None = None):
    """The block tables, one row per running sequence: logical block i of the sequence (column i) names the
    pool block that holds it, and is filled as far as the sequence has written it.  Returns ``ax``."""
    import matplotlib.patches as mpatches

    colors = colors if colors is not None else palette([snap])
    width = width or max([len(s.table) for s in snap.seqs] + [1])
    for row, s in enumerate(snap.seqs):
        for i, b in enumerate(s.table):
            used = min(snap.block_size, s.cached - i * snap.block_size) / snap.block_size
            ax.add_patch(mpatches.Rectangle((i + 0.05, row + 0.1), 0.9, 0.8, facecolor=FREE_COLOR, edgecolor="k", lw=1))
            ax.add_patch(mpatches.Rectangle((i + 0.05, row + 0.1), 0.9 * used, 0.8, facecolor=colors.get(s.label, "k"),
                                            edgecolor="none"))
            shared = snap.ref_count[b] > 1
            ax.text(i + 0.5, row + 0.5, f"{b}" + ("*" if shared else ""), ha="center", va="center", fontsize=7,
                    bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})
    ax.set_xlim(0, width)
    ax.set_ylim(max(len(snap.seqs), 1), 0)
    ax.set_yticks([r + 0.5 for r in range(len(snap.seqs))], [s.label for s in snap.seqs], fontsize=8)
    ax.set_xticks([i + 0.5 for i in range(width)], [str(i) for i in range(width)], fontsize=7)
    ax.set_xlabel("logical block (positions i * block_size ...); the number is the pool block, * = shared", fontsize=8)
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    return ax


def draw_arena(ax, num_slots: int, spans, colors: dict | None = None):
    """A contiguous arena as one bar of ``num_slots`` slots.

    ``spans``: ``(label, start, used, reserved)`` per live reservation: slots ``start .. start + used`` hold K/V
    (solid), the rest of the reservation is held but empty (hatched), and slots outside every reservation are
    free (white).  Returns ``ax``.
    """
    import matplotlib.patches as mpatches

    colors = colors or {}
    ax.add_patch(mpatches.Rectangle((0, 0), num_slots, 1, facecolor="white", edgecolor="k", lw=1))
    for i, (label, start, used, reserved) in enumerate(spans):
        c = colors.get(label, f"C{i % 10}")
        ax.add_patch(mpatches.Rectangle((start, 0), used, 1, facecolor=c, edgecolor="none"))
        ax.add_patch(mpatches.Rectangle((start + used, 0), reserved - used, 1, facecolor=c, alpha=0.25,
                                        hatch="//", edgecolor=c, lw=0))
        ax.add_patch(mpatches.Rectangle((start, 0), reserved, 1, facecolor="none", edgecolor="k", lw=1))
        ax.text(start + reserved / 2, 0.5, label, ha="center", va="center", fontsize=8,
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})
    ax.set_xlim(0, num_slots)
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ax.set_xlabel("arena slot")
    return ax


def arena_spans(seqs) -> list[tuple[str, int, int, int]]:
    """``(label, start, used, reserved)`` for each sequence that holds a contiguous reservation (``seq.kv``)."""
    return [(seq_label(s), s.kv.start, s.kv.length, s.kv.max_len) for s in seqs if s.kv is not None]


def free_runs(num_slots: int, spans) -> list[tuple[int, int]]:
    """``(start, length)`` of each run of free slots in an arena holding ``spans`` (as :func:`arena_spans` gives)."""
    runs, start = [], 0
    for _, s, _, reserved in sorted(spans, key=lambda span: span[1]):
        if s > start:
            runs.append((start, s - start))
        start = max(start, s + reserved)
    if num_slots > start:
        runs.append((start, num_slots - start))
    return runs


def render(snap: PoolSnapshot, colors: dict | None = None, columns: int | None = None, width: int | None = None):
    """One frame of the explorer: the pool (above) and the block tables (below), with the counts as a title."""
    import matplotlib.pyplot as plt

    columns = columns or min(snap.num_blocks, 16)
    rows = -(-snap.num_blocks // columns)
    n = max(len(snap.seqs), 1)
    fig, (ax, tables) = plt.subplots(2, 1, figsize=(9, 0.75 * rows + 0.3 * n + 1.8),
                                     gridspec_kw={"height_ratios": [1.3 * rows, 0.55 * n + 0.6]})
    draw_pool(snap, ax, colors, columns)
    draw_tables(snap, tables, colors, width)
    ax.set_title(f"step {snap.step}: {snap.blocks_held} of {snap.num_blocks} blocks held, {snap.num_free} free; "
                 f"{snap.positions_used} positions of K/V in {snap.blocks_held * snap.block_size} held; "
                 f"preemptions so far {snap.preemptions}, copies {snap.copies}", fontsize=9)
    fig.tight_layout()
    return fig


def show(snap: PoolSnapshot, colors: dict | None = None, columns: int | None = None, width: int | None = None) -> None:
    """Draw one snapshot and print what happened and the block tables (what the explorer shows)."""
    import matplotlib.pyplot as plt

    render(snap, colors, columns, width)
    plt.show()
    print(f"step {snap.step}: {snap.note}")
    print(snap.table_text())
    if snap.waiting:
        print("waiting:", ", ".join(snap.waiting))


def pool_explorer(snaps, columns: int | None = None):
    """A step slider over recorded snapshots, drawn through ``interactive_output`` (no Output/clear_output)."""
    import ipywidgets as widgets

    colors = palette(snaps)
    width = max(len(s.table) for snap in snaps for s in snap.seqs) if any(snap.seqs for snap in snaps) else 1
    slider = widgets.IntSlider(value=0, min=0, max=len(snaps) - 1, description="step", continuous_update=False)
    out = widgets.interactive_output(lambda step: show(snaps[step], colors, columns, width), {"step": slider})
    return widgets.VBox([slider, out])
