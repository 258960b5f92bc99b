"""Draw docs/img/package_map.png: ctxkit's packages as floors, each above what it imports.

    python docs/package_map.py            # needs grimp (the import-linter graph) and matplotlib

The graph is grimp's, the one import-linter checks and tests/test_architecture.py counts
(imports inside functions included). A package's floor is the length of the longest import
chain below it, so every arrow points down; a box's width follows the package's lines of code.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def package_graph():
    """``(rooms, arrows)``: the top-level packages/modules of ctxkit and who imports whom."""
    import grimp

    sys.path.insert(0, str(ROOT / "src"))
    graph = grimp.build_graph("ctxkit", include_external_packages=False)
    rooms, arrows = set(), set()
    for module in graph.modules:
        parts = module.split(".")
        if len(parts) < 2:
            continue
        rooms.add(parts[1])
        for other in graph.find_modules_directly_imported_by(module):
            there = other.split(".")
            if len(there) > 1 and there[1] != parts[1]:
                arrows.add((parts[1], there[1]))
    return sorted(rooms), sorted(arrows)


def floors(rooms, arrows):
    """Each room's floor: 0 for what imports nothing of ctxkit, else one above its highest import."""
    below = defaultdict(set)
    for a, b in arrows:
        below[a].add(b)
    level = {}

    def floor(room, seen=()):
        if room in seen:
            raise SystemExit(f"an import circle through {room}: {' -> '.join(seen + (room,))}")
        if room not in level:
            level[room] = 1 + max((floor(b, seen + (room,)) for b in below[room]), default=-1)
        return level[room]

    for room in rooms:
        floor(room)
    return level


def lines_of(room: str) -> int:
    path = ROOT / "src" / "ctxkit" / room
    files = list(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]
    return sum(len(f.read_text(encoding="utf-8").splitlines()) for f in files if f.is_file())


def draw(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    rooms, arrows = package_graph()
    level = floors(rooms, arrows)
    by_floor = defaultdict(list)
    for room in rooms:
        by_floor[level[room]].append(room)
    top = max(by_floor)
    size = {room: max(lines_of(room), 50) for room in rooms}
    place = {}
    for f, names in by_floor.items():
        names.sort(key=lambda r: -size[r])
        total = sum(max(size[r] ** 0.5, 22) for r in names) + 12 * (len(names) - 1)
        x = -total / 2
        for r in names:
            w = max(size[r] ** 0.5, 22)
            place[r] = (x, f * 30, w)
            x += w + 12
    fig, ax = plt.subplots(figsize=(14, 1.2 * (top + 1) + 1))
    for r, (x, y, w) in place.items():
        ax.add_patch(FancyBboxPatch((x, y), w, 12, boxstyle="round,pad=0.5", fc="#dce6f2", ec="#34495e", lw=1))
        ax.text(x + w / 2, y + 6, f"{r}{'/' if (ROOT / 'src' / 'ctxkit' / r).is_dir() else ''}\n{size[r]:,} lines",
                ha="center", va="center", fontsize=8)
    for a, b in arrows:
        xa, ya, wa = place[a]
        xb, yb, wb = place[b]
        ax.add_patch(FancyArrowPatch((xa + wa / 2, ya - 0.5), (xb + wb / 2, yb + 12.5), arrowstyle="-|>", mutation_scale=8,
                                     color="#7f8c8d", lw=0.6, alpha=0.6, connectionstyle="arc3,rad=0.05"))
    xs = [x for x, _, _ in place.values()] + [x + w for x, _, w in place.values()]
    ax.set_xlim(min(xs) - 10, max(xs) + 10)
    ax.set_ylim(-8, top * 30 + 22)
    ax.axis("off")
    ax.set_title(f"ctxkit: {len(rooms)} rooms on {top + 1} floors, {len(arrows)} arrows, every one pointing down "
                 "(python docs/package_map.py)", fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    print(f"{out}: {len(rooms)} rooms, {top + 1} floors, {len(arrows)} arrows")


if __name__ == "__main__":
    draw(ROOT / "docs" / "img" / "package_map.png")
